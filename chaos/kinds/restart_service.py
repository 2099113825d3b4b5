"""``restart_service``: PostgreSQL, RabbitMQ or the S3 store killed (RabbitMQ stopped cleanly) and started again
after ``duration`` seconds. It affects every run on the stack: such a scenario runs alone."""

from __future__ import annotations

from . import first_delay, own_lines

ACTION = "restart_service"
RECORDS = "fault action=restart_service phase=start (service, how) and phase=end (ready_seconds)"
WEIGHT = 2
SERVICES = ("postgres", "rabbitmq", "s3")


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    ctx.log(f"restarting {step['service']} (down {step.get('duration', 0)}s)")
    took = ctx.services.restart(step["service"], float(step.get("duration", 0)))
    ctx.log(f"{step['service']} back after {took:.1f}s")


def draw(rng, pick) -> dict:
    return {"action": "restart_service", "service": rng.choice(SERVICES), "at": pick.at,
            "duration": round(rng.uniform(0.0, 1.5), 2), "timeout": 60}


def happened(step, history, final) -> tuple[bool, str]:
    """This step's restart started (its start line names the step; an older history: any on the service)."""
    done = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "start"
            and e.get("service") == step.get("service")]
    done = own_lines(step, done)
    return bool(done), f"{ACTION} on {step.get('service')} {len(done)} times"
