"""``s3_deny``: the object store refuses every write of the run's own key with 403 AccessDenied — a permanent error,
not an outage — for the rest of the run (or ``duration`` seconds).

Toxiproxy cannot answer 403, so the harness changes what the run's S3 key may do: it replaces the key's policy
(SeaweedFS's embedded IAM, written with the harness's admin key) with one that still allows reads, listings and
deletes in the run's bucket but no ``PutObject`` (nor a multipart upload or a copy). The API has staged what it
accepted before the fault (``after_workload``, the default, waits for the workload to end), so what meets the
refusal is the consumers' writes of the variants. The harness then proves the refusal itself: PUTs with the run's
key must answer 403 three times in a row (``fault`` line ``phase=start`` with ``probe_status`` and every answer in
``probes``; a PUT that went through sets the refusal again); anything else is recorded and the step does not count as
having happened. Without ``duration`` the refusal holds through the drain and the final read (a
job that is retried forever never ends); the full policy is given back at the end of the step, or never when the
run ends first (each run's key and bucket are its own).

A proven refusal can still lapse: SeaweedFS's identity configuration is saved whole, and a write of it racing ours
(another run's tenant made meanwhile) gave a denied key its writes back 3 s after three probes had answered 403 (the
reference's L5 grade in a CI rehearsal: all four jobs ready, met by none). So while the refusal is meant to hold, a
guard keeps probing and sets it again at once after a PUT that went through, recording the lapse (``fault``
``phase=lapsed``: the last refused probe before it and when it was set again): the checks judge a job that ended
``ready`` meanwhile by it, never as having met the refusal.
"""

from __future__ import annotations

import functools
import threading
import time

from . import first_delay

ACTION = "s3_deny"
RECORDS = ("fault action=s3_deny phase=start (bucket, denied, probe_status, probe_code, probes, applied_wall), "
           "phase=lapsed (refused_until_wall, lapsed_wall, reapplied_wall) and phase=end (restored)")
PROBE_KEY = "harness-probe/s3-deny"


def bucket_and_key(ctx) -> tuple[str | None, str | None, str | None]:
    """The run's bucket and S3 key, as its roles were given them (the contract's S3_* variables)."""
    for instance in list(getattr(ctx.supervisor, "instances", {}).values()):
        env = getattr(instance, "env", None) or {}
        if env.get("S3_BUCKET") and env.get("S3_ACCESS_KEY"):
            return env["S3_BUCKET"], env["S3_ACCESS_KEY"], env.get("S3_SECRET_KEY")
    return None, None, None


def set_writes(store, bucket: str, writes: bool) -> None:
    store.set_tenant_writes(bucket, writes)


@functools.lru_cache(maxsize=16)
def probe_client(endpoint_url: str, access_key: str, secret_key: str):
    """One client per run key (the guard probes four times a second; a boto3 client costs tens of ms to make)."""
    from harness.stack.seaweedfs import s3_client

    return s3_client(endpoint_url, access_key, secret_key, timeout=5)


def probe(store, bucket: str, access_key: str, secret_key: str) -> tuple[int | None, str]:
    """A PUT with the run's own key: (HTTP status, error code) — 200 when the write went through."""
    client = probe_client(store.endpoint_url(), access_key, secret_key)
    try:
        client.put_object(Bucket=bucket, Key=PROBE_KEY, Body=b"probe")
    except Exception as exc:  # noqa: BLE001 - the answer is the evidence
        response = getattr(exc, "response", None) or {}
        return (response.get("ResponseMetadata") or {}).get("HTTPStatusCode"), \
            (response.get("Error") or {}).get("Code") or type(exc).__name__
    try:
        client.delete_object(Bucket=bucket, Key=PROBE_KEY)
    except Exception:  # noqa: BLE001 - a leftover probe object is harmless
        pass
    return 200, ""


# The refusal counts as in force after this many 403s in a row, this far apart: one 403 proved little once, as a
# write of the identity configuration racing ours can give the key its writes back after it (a lost update).
STABLE_PROBES = 3
PROBE_SPACING_SECONDS = 0.3
# How often the guard probes a refusal in force: a lapse lets writes through for about this long.
GUARD_SPACING_SECONDS = 0.25


def prove_refusal(ctx, store, bucket: str, access_key, secret_key, deadline: float) -> tuple[int | None, str, list,
                                                                                              float | None]:
    """Probe until STABLE_PROBES PUTs in a row answer 403, setting the refusal again after a PUT that went through,
    until ``deadline``: (403 once proven, else the last other answer; its error code; every status seen; when the
    refusal was last set again, None if never)."""
    answers: list = []
    streak = 0
    reapplied: float | None = None
    other: tuple[int | None, str] = (None, "")
    while True:
        status, code = probe(store, bucket, access_key, secret_key)
        answers.append(status)
        if status == 403:
            streak += 1
            if streak >= STABLE_PROBES:
                return status, code, answers, reapplied
        else:
            streak, other = 0, (status, code)
        if time.monotonic() > deadline or ctx.stopping.is_set():
            return other[0], other[1] or f"no {STABLE_PROBES} refusals in a row", answers, reapplied
        if status == 200:
            reapplied = time.time()
            set_writes(store, bucket, writes=False)
        time.sleep(PROBE_SPACING_SECONDS)


WEIGHT = 1
ONCE = True


def draw(rng, pick) -> dict:
    """For ``harness soak``: a refusal once the workload has ended, lifted after a while (a correct implementation
    retries within its budget, or ends failed with an error_code while it was in force, which lost_accepted_work
    counts as an outcome of a transient fault)."""
    return {"action": ACTION, "at": pick.at, "duration": round(rng.uniform(0.5, 2.0), 2)}


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    if step.get("after_workload", True):
        deadline = time.monotonic() + float(step.get("timeout", 30))
        while not ctx.workload_done.wait(0.05):
            if time.monotonic() > deadline or ctx.stopping.is_set():
                ctx.history.append("note", message="s3_deny: the workload did not end in time", fault=step["index"])
                return
    store = getattr(ctx.stack, "s3", None)
    bucket, access_key, secret_key = bucket_and_key(ctx)
    if store is None or not hasattr(store, "endpoint_url") or not bucket:
        ctx.history.append("note", message="s3_deny: no S3 store of the harness's own, or no run bucket: cannot "
                           "refuse writes", fault=step["index"])
        return
    # The refusal is in force from the policy change, seconds before the probe proves it on a loaded machine: a job
    # that met it meanwhile (a fast worker fails at once) must be judged as having met it.
    applied_wall = time.time()
    set_writes(store, bucket, writes=False)
    status, code, answers, reapplied = prove_refusal(ctx, store, bucket, access_key, secret_key,
                                                     time.monotonic() + float(step.get("timeout", 30)))
    # A write that went through meanwhile means the refusal holds only from its last setting (a job that ended
    # between the two is then not judged by it, never judged wrongly).
    ctx.history.append("fault", action=ACTION, phase="start", fault=step["index"], service="s3", bucket=bucket,
                       denied="write", probe_status=status, probe_code=code, applied_wall=reapplied or applied_wall,
                       probes=answers)
    ctx.log(f"S3 writes refused in {bucket} (probe: {status} {code})")
    step["_denied"] = bucket
    duration = step.get("duration")
    if duration is None:  # held to the end of the run: guarded until the run stops, this step's thread is done
        threading.Thread(target=guard, args=(ctx, step, store, bucket, access_key, secret_key, None), daemon=True,
                         name=f"s3-deny-guard-{step['index']}").start()
        return
    guard(ctx, step, store, bucket, access_key, secret_key, time.monotonic() + float(duration))
    restore(ctx, step)


def guard(ctx, step, store, bucket: str, access_key, secret_key, until: float | None) -> None:
    """Keep the refusal in force until ``until`` (monotonic) or the run stops: probe every GUARD_SPACING_SECONDS and,
    after a PUT that went through, set the refusal again and record the lapse."""
    refused_until = time.time()
    while not ctx.stopping.wait(GUARD_SPACING_SECONDS):
        if until is not None and time.monotonic() >= until:
            return
        asked = time.time()
        status, code = probe(store, bucket, access_key, secret_key)
        if status == 403:
            refused_until = asked
        elif status == 200 and not ctx.stopping.is_set():
            set_writes(store, bucket, writes=False)
            ctx.history.append("fault", action=ACTION, phase="lapsed", fault=step["index"], service="s3",
                               bucket=bucket, refused_until_wall=refused_until, lapsed_wall=asked,
                               reapplied_wall=time.time())
            ctx.log(f"S3 refusal in {bucket} lapsed (a PUT went through): set again")


def restore(ctx, step) -> None:
    bucket = step.pop("_denied", None)
    if not bucket:
        return
    store = getattr(ctx.stack, "s3", None)
    set_writes(store, bucket, writes=True)
    ctx.history.append("fault", action=ACTION, phase="end", fault=step["index"], service="s3", bucket=bucket,
                       restored=True)


def happened(step, history, final) -> tuple[bool, str]:
    starts = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "start"
              and e.get("fault") == step.get("index")]
    if not starts:
        return False, "the store's refusal of writes was never set"
    refused = [e for e in starts if e.get("probe_status") == 403]
    if not refused:
        e = starts[0]
        return False, f"writes were to be refused, but the harness's own PUTs answered {e.get('probe_status')} " \
                      f"{e.get('probe_code') or ''}".strip() + (f" (every answer: {e['probes']})" if e.get("probes") else "")
    return True, f"writes refused in {refused[0].get('bucket')}: the harness's own PUTs answered 403 " \
                 f"{refused[0].get('probe_code')}, {len(refused[0].get('probes') or [1])} probes"
