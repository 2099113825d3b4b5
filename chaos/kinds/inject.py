"""``inject``: messages no consumer can process published into the work queue (harness/inject.py: not JSON,
schema-invalid, an unknown job), through the default exchange so they reach it whatever the topology; their
deliveries are traced from then on."""

from __future__ import annotations

from . import first_delay

ACTION = "inject"
RECORDS = "fault action=inject phase=publish (kind, marker, raw, body, routed) per message; notes when none could be built"
WEIGHT = 1


def run(ctx, step) -> None:
    from harness import inject
    from harness.seeding import stream

    if not ctx.wait_trigger(step, first_delay(step)):
        return
    kinds = list((step.get("params") or {}).get("kinds") or inject.KINDS)
    rng = stream(ctx.seed, f"inject-{step['index']}")
    template = next((m["body"] for m in ctx.broker.tap.tapped() if isinstance(m.get("body"), dict)
                     and m["body"].get("job_id")), None)
    traced = ctx.broker.tap.trace_deliveries()
    queue = ctx.adapter.broker["work_queue"]
    sent = 0
    for _ in range(int(step.get("count", 1))):
        for kind in kinds:
            marker = f"harness-dl-{rng.getrandbits(48):012x}"
            raw, body = inject.build(kind, marker, template, rng)
            if raw is None:
                ctx.history.append("note", message=f"inject {kind}: no message seen yet to copy the shape of",
                                   fault=step["index"])
                continue
            routed = ctx.broker.management.publish("", queue, raw, inject.properties(marker, body))
            sent += 1
            ctx.history.append("fault", action="inject", phase="publish", fault=step["index"], kind=kind,
                               marker=marker, message_id=marker, sha256=inject.digest(raw), raw=raw[:2000],
                               body=body, job_id=(body or {}).get("job_id"), queue=queue, routed=routed,
                               deliveries_traced=traced)
    ctx.log(f"injected {sent} unprocessable messages into {queue}")


def allowed(adapter, level: int) -> str | None:
    return None if level >= 4 else "dead-lettering unprocessable messages is required from level 4"


def draw(rng, pick) -> dict:
    from harness.inject import KINDS

    chosen = sorted(rng.sample(list(KINDS), rng.randint(1, len(KINDS))))
    return {"action": "inject", "at": pick.at, "when": "message", "count": 1, "params": {"kinds": chosen},
            "timeout": 60}


def happened(step, history, final) -> tuple[bool, str]:
    done = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "publish"
            and e.get("routed")]
    return bool(done), f"{len(done)} unprocessable messages injected into the work queue"
