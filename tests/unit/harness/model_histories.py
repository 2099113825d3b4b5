"""A small model of a *correct* attachment pipeline, for property tests of the checkers.

Hypothesis draws the choices (``models()``); :class:`PipelineModel` plays them out on one clock the way a correct
implementation would, and records what the harness would have seen: the history (uploads and their answers, tapped
messages, polled states and /events, queue depths, peeks into the work queue, consumer samples, faults, holds, role
starts and exits, operator replays), the final state (GET body, /events, S3 objects, bucket listing, queue depths)
and run.json (adapter summary, scenario checks, fault schedule). Mutations edit a played model before ``build()``.

A run is a sequence of *episodes*, each in its own stretch of time (20–30 s gaps keep one episode's crash window
free of another's traffic):

* ``flow``    — good / bad / poison uploads: a direct 202; an unknown outcome (lost answer, 503) retried with the
                same key; a bad file refused (415), maybe after it was staged; an upload the server committed but
                whose every answer was lost, so the client gave up (the harness never learns its id). Claims on one
                or two lanes of one consumer, transient errors retried with full-jitter backoff, poison that fails
                at once or exhausts its attempts, bad input failed with an error_code (or leniently decoded), a
                relay publishing twice (publisher-confirm window), concurrent copies of a queued job's message and
                copies of ready jobs' messages (harness ``republish``), all consumed as no-ops;
* ``crash``   — a consumer SIGKILLed or crashed at a failpoint (``after_s3_write_before_commit``,
                ``after_commit_before_ack``) with one or two deliveries in flight, maybe one committed just before
                in the same batch, maybe one committing in the instant between the SIGKILL line and the signal;
                lease recovery held (``hold`` of the ``recovers_work`` roles) or running; peeks into the work queue
                while the consumer is down; consumer samples around it; the restarted consumer keeps the
                redelivered message until the lease is recovered, or acks it as "busy" and lets recovery publish
                anew; recovery by the recovering role or a takeover by the consumer itself;
* ``pause``   — the consumer SIGSTOPped with a job for 2.25 leases; a second instance starts; at level ≥ 4 the job
                is recovered while the owner sleeps and finished by the new owner (before or after SIGCONT), the
                stale owner is fenced (no write at all); at level 3 recovery is optional;
* ``backlog`` — consumers held while uploads queue up, then released and sampled (``consumer`` lines) while one
                instance drains the backlog on up to ``prefetch`` lanes; poison and bad items fail inside a batch;
* ``orphan``  — the API (or relay) dies after staging, before the record (no 202; an orphan staging object that
                retention removes or that is still young), or after the commit, before the publish (the relay
                publishes once it is back; the client's retry gets the same ids);
* ``replay``  — (level ≥ 4) poison and attempt-exhausted work fail, then the harness replays every failed
                attachment it saw: its own call (401/403 without a token, 202 with one), failed→queued, a new
                attempt under a fresh attempt budget (which may be spent again);
* ``expiry``  — (a run of its own, short ``job_ttl_seconds``) consumers held while uploads arrive; what ran out of
                time ends ``failed`` with the expiry error_code, by the sweeper (queued→failed) or by the worker
                (processing→failed, at the claim, or at the commit after its objects were written: left
                unreferenced); uploads after the release reach ``ready``.

Contract readings the model varies: levels 3–5; attempts counted at (re)queue or at claim; a lease recovery as a
new attempt or not; free ``actor``/``reason`` wording; event ``seq`` per attachment or global; timestamps with
``Z`` or ``+00:00``; the events capability on or off; ``message_id`` equal to the job_id, fresh, or absent; extra
message fields and headers; the message's ``attempt`` (the current or the coming one); any role names (the
adapter's ``consumers``/``recovers_work``), lease recovery in a role of its own or in the consumer; object layouts
(staging and variants in separate folders or one); originals of failed work released by retention.

What the model keeps inside the harness's scenario design, because the checkers cannot tell it from a bug (see the
report of the property tests): a requeued job is claimed again within ``retry_cap + 5`` s (the retry-delay bound
measures queue wait too); only one consumer instance takes part in a crash or a pause (the checkers cannot tell
which instance held which job); without a peek into the queue a crashed delivery is kept, not acked as "busy"
(queue depth alone cannot tell that from an early ack); work accepted after an expiry hold is processed within its
TTL; an expired job is not replayed; nothing is deleted from S3 except released originals of failed work and
orphans.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass, field

from hypothesis import strategies as st

from harness.history import History
from harness_histories import T0, Builder

NS = uuid.UUID("3b0c4d8e-2f6a-4e1b-9c7d-5a4f3e2d1c0b")
LEVEL_VARIANTS = {3: ["thumbnail"], 4: ["thumbnail", "crop", "optimized"]}
STEMS = ["holiday", "scan", "avatar", "receipt", "photo"]
WORDS = ["api", "worker", "sweeper", "relay", "operator:api", "ops:7f3a", "janitor", "system", "admin", "reaper",
         "worker:host-1:4242", "lease-recovery", "river", "retry", "expiry", "replay"]
REASONS = [None, "", "created", "claimed", "transient: storage timeout", "lease expired", "operator replay",
           "decode_failed", "expired", "retry in 0.4s", "attempt budget spent"]
EXTRA_FIELDS = {"producer": "go-relay", "shard": 3, "priority": 5, "tenant": "t-42", "schema": "jobs.v1",
                "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "retry": {"count": 1, "max": 9}}
CONSUMER_NAMES = ["worker", "render", "jobs", "consumer", "processor"]
RECOVERY_NAMES = ["sweeper", "janitor", "reaper", "maintenance"]
API_NAMES = ["api", "gateway", "http"]


def uid(*parts) -> str:
    return str(uuid.uuid5(NS, "/".join(str(p) for p in parts)))


def iso(epoch: float, style: str = "Z") -> str:
    from datetime import datetime, timezone

    text = datetime.fromtimestamp(epoch, timezone.utc).isoformat()
    return text.replace("+00:00", "Z") if style == "Z" else text


@dataclass
class Config:
    level: int
    lease: float
    max_attempts: int
    retry_base: float
    retry_cap: float
    sweep: float
    retention: float
    ttl: float | None              # the declared job_ttl_seconds (None: not declared)
    expiry_code: str
    convention: str                # "queue": attempt grows on the (re)queue; "claim": on the next claim
    consumer: str
    recoverer: str                 # the recovers_work role; may be the consumer itself
    api: str
    relay: str | None              # a relay role of its own, or None (inside the API)
    prefetch: int                  # the adapter's [limits] prefetch
    layout: str                    # "split": staging/ and variants/ folders; "shared": one folder per attachment
    staging_prefix: str
    variant_prefix: str
    work_queue: str
    words: dict
    extras: dict
    message_id: str                # "job", "fresh" or "none"
    message_attempt: str           # "current" or "coming" (claim convention: the attempt the next claim gets)
    seq_style: str                 # "per_attachment" or "global"
    time_style: str                # "Z" or "+00:00"
    failpoints: bool
    replay: bool
    events: bool = True            # the events capability (GET /events)
    recovery_new_attempt: bool = True  # a lease recovery starts a new attempt (or keeps the old number)


@dataclass
class Msg:
    job: "Job"
    attempt: int
    published: float
    acked: float | None = None
    deliveries: list = field(default_factory=list)   # [start, end or None] while a consumer holds it
    line: dict | None = None                         # the tapped history line

    def present(self, at: float) -> bool:
        return self.published <= at and (self.acked is None or at < self.acked)

    def held(self, at: float) -> bool:
        return any(s <= at and (e is None or at < e) for s, e in self.deliveries)


@dataclass
class Job:
    att: str
    job_id: str
    kind: str
    filename: str
    created: float
    expires: float | None
    size: int = 1000                               # the uploaded bytes: the original is stored as sent
    invoke: dict | None = None
    ok: dict | None = None
    trans: list = field(default_factory=list)
    attempt: int = 1
    pending: bool = False          # claim convention: the next claim starts a new attempt
    base: int = 0                  # attempt number the current budget started from (operator replay)
    state: str | None = None
    error_code: str | None = None
    written: dict = field(default_factory=dict)      # variant -> last write time (effect key: one object each)
    leftovers: dict = field(default_factory=dict)    # unreferenced objects (expired during its work)
    queue: list = field(default_factory=list)        # its messages not yet consumed
    script: list = field(default_factory=list)       # what happens at each coming claim
    tags: set = field(default_factory=set)


class PipelineModel(Builder):
    """Plays a correct pipeline on one clock; ``finish()`` turns it into (history, final, run)."""

    def __init__(self, cfg: Config, draw, seed: int):
        roles = {cfg.api: 1, cfg.consumer: 1}
        if cfg.relay:
            roles[cfg.relay] = 1
        if cfg.recoverer != cfg.consumer:
            roles[cfg.recoverer] = 1
        super().__init__(level=cfg.level, lease=cfg.lease, max_attempts=cfg.max_attempts,
                         scenario={"name": "model", "checks": []}, roles=roles)
        self.cfg, self.draw, self.rng = cfg, draw, random.Random(seed)
        adapter = self.run["adapter"]
        adapter["timings"] = {"lease_seconds": cfg.lease, "max_attempts": cfg.max_attempts,
                              "retry_base_seconds": cfg.retry_base, "retry_cap_seconds": cfg.retry_cap,
                              "sweep_interval_seconds": cfg.sweep, "staging_retention_seconds": cfg.retention}
        if cfg.ttl is not None:
            adapter["timings"]["job_ttl_seconds"] = cfg.ttl
        adapter["consumers"] = [cfg.consumer]
        adapter["recovers_work"] = [cfg.recoverer]
        adapter["capabilities"] = {"failpoints": cfg.failpoints, "replay": cfg.replay, "events": cfg.events}
        adapter["expiry"] = {"error_code": cfg.expiry_code, "metric": "jobs_expired_total"}
        adapter["limits"] = {"prefetch": cfg.prefetch}
        adapter["broker"] = {"work_queue": cfg.work_queue}
        self.run["schedule"] = []
        self.jobs: dict[str, Job] = {}
        self.msgs: list[Msg] = []
        self.orphans: list[tuple[str, float, int]] = []   # (key, written at, size): never-recorded uploads
        self.instances = [cfg.consumer]
        self.uploads = 0
        self.ctags = 0
        self.crashes: list[dict] = []        # {"wall", "held", "peeks": [lines], "in_flight": [att]}
        self.episodes: list[str] = []
        self.now = 0.0
        self.finished = None
        self.force: dict = {}                  # choices a property pins (e.g. a crash probed by peeks)
        self.release_failed = False            # originals of failed work released by retention at the end
        for name in roles:
            self.add(0.05, "role", role=name, action="start", pid=1000 + len(self.events), armed=None)
        self.add(0.08, "observe", source="tap", queue="harness.tap", firehose=False)
        self.add(0.09, "observe", source="binding", exchange="jobs", routing_key=cfg.work_queue)
        self.now = 0.5

    def __repr__(self) -> str:
        """The minimal history Hypothesis prints for a failing example: configuration, episodes, faults, and each
        attachment's transitions (t: from→to #attempt)."""
        cfg = self.cfg
        lines = [f"PipelineModel(level={cfg.level}, lease={cfg.lease}, max_attempts={cfg.max_attempts}, "
                 f"attempts counted at {cfg.convention}, recovery new attempt={cfg.recovery_new_attempt}, "
                 f"consumer={cfg.consumer!r}, recovers_work={cfg.recoverer!r}, events={cfg.events}, "
                 f"ttl={cfg.ttl}, failed originals released={self.release_failed}, "
                 f"episodes={self.episodes}, schedule={[s['action'] for s in self.run['schedule']]},"
                 f" crashes={[{k: c[k] for k in ('wall', 'held', 'in_flight', 'kind')} for c in self.crashes]},"]
        for job in self.jobs.values():
            steps = ", ".join(f"{t['at']:.2f}: {t['from']}→{t['to']} #{t['attempt']}" for t in job.trans)
            lines.append(f"  {job.att[:8]} {job.kind}{'' if job.ok else ' (no 202)'} {sorted(job.tags) or ''}: "
                         f"{steps}")
        return "\n".join(lines) + ")"

    # --- draws -------------------------------------------------------------------------------------------------
    def dur(self, lo: float, hi: float) -> float:
        return self.draw(st.integers(round(lo * 100), round(hi * 100))) / 100

    def flag(self, name: str | None = None) -> bool:
        if name in self.force:
            return self.force[name]
        return self.draw(st.booleans())

    def pick(self, options):
        return self.draw(st.sampled_from(list(options)))

    def num(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def jitter(self, lo: float, hi: float) -> float:
        """Cosmetic delays (tap, poll): seeded, not shrunk."""
        return round(self.rng.uniform(lo, hi), 3)

    def actor(self, what: str, instance: str | None = None) -> str:
        word = self.cfg.words[what]
        return f"{word}:{instance}" if instance and self.cfg.words.get("with_instance") else word

    def reason(self, what: str):
        return self.cfg.words.get(f"reason_{what}")

    def fault_index(self, step: dict) -> int:
        step = {"index": len(self.run["schedule"]), **step}
        self.run["schedule"].append(step)
        return step["index"]

    # --- server-side operations --------------------------------------------------------------------------------
    def transition(self, job: Job, at: float, to: str, actor: str, reason=None) -> None:
        assert not job.trans or at > job.trans[-1]["at"], (job.att, at, job.trans[-1])
        job.trans.append({"at": at, "from": job.state, "to": to, "attempt": job.attempt, "actor": actor,
                          "reason": reason})
        job.state = to

    def message_attempt(self, job: Job) -> int:
        if self.cfg.message_attempt == "coming" and job.pending:
            return job.attempt + 1
        return job.attempt

    def publish(self, job: Job, at: float) -> Msg:
        cfg = self.cfg
        body = {"schema_version": 1, "job_id": job.job_id, "attempt": self.message_attempt(job),
                "attachment_id": job.att, "pipeline_version": 1, "variants": LEVEL_VARIANTS[min(cfg.level, 4)],
                "created_at": iso(T0 + job.created, cfg.time_style),
                "expires_at": iso(T0 + (job.expires if job.expires is not None else job.created + 86400),
                                  cfg.time_style), **cfg.extras}
        properties = {"content_type": "application/json", "delivery_mode": 2}
        if cfg.message_id == "job":
            properties["message_id"] = job.job_id
        elif cfg.message_id == "fresh":
            properties["message_id"] = uid("message", len(self.msgs))
        if cfg.extras:
            properties["headers"] = {"x-attempt": body["attempt"],
                                     "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
        msg = Msg(job, body["attempt"], at)
        msg.line = self.add(at + self.jitter(0.01, 0.2), "message", exchange="jobs", routing_key=cfg.work_queue,
                            source="binding", properties=properties, body=body, body_raw=None)
        job.queue.append(msg)
        self.msgs.append(msg)
        return msg

    def ack(self, msg: Msg, at: float) -> None:
        msg.acked = at
        for d in msg.deliveries:
            if d[1] is None:
                d[1] = at

    def noop(self, msg: Msg, at: float) -> None:
        """A delivery of a job that is ready, failed, busy elsewhere or of an older attempt: acked, no effect."""
        if msg in msg.job.queue:
            msg.job.queue.remove(msg)
        msg.deliveries.append([at, None])
        self.ack(msg, at + 0.01)

    def claim(self, job: Job, at: float, instance: str, msg: Msg | None = None) -> Msg:
        msg = msg or min(job.queue, key=lambda m: m.published)   # the oldest message waiting
        if msg in job.queue:
            job.queue.remove(msg)
        assert msg.published < at, (job.att, msg.published, at, job.trans, self.episodes)
        if not any(d[1] is None for d in msg.deliveries):
            msg.deliveries.append([at - 0.01, None])
        if job.pending:
            job.attempt += 1
            job.pending = False
        self.transition(job, at, "processing", self.actor("claim", instance), self.reason("claim"))
        return msg

    def requeue(self, job: Job, at: float, actor: str, reason=None, new_attempt: bool = True) -> None:
        """processing → queued (transient error, lease recovery) or failed → queued (operator replay): a new
        attempt, counted here or at the next claim."""
        if not new_attempt:
            pass
        elif self.cfg.convention == "queue":
            job.attempt += 1
        else:
            job.pending = True
        self.transition(job, at, "queued", actor, reason)

    def recover(self, job: Job, at: float, actor: str) -> None:
        """Lease recovery: processing → queued, a new attempt or (implementation's choice) the same number."""
        self.requeue(job, at, actor, self.reason("recover"), new_attempt=self.cfg.recovery_new_attempt)

    def attempts_left(self, job: Job) -> int:
        """How many more claims the budget allows after the current attempt."""
        return job.base + self.cfg.max_attempts - job.attempt - (1 if job.pending else 0)

    def write_variants(self, job: Job, start: float, end: float) -> None:
        names = LEVEL_VARIANTS[min(self.cfg.level, 4)]
        for i, name in enumerate(names):
            job.written[name] = round(start + (end - start) * (i + 1) / (len(names) + 1), 3)

    def commit_ready(self, job: Job, start: float, end: float, instance: str) -> None:
        self.write_variants(job, start, end)
        self.transition(job, end, "ready", self.actor("ready", instance), self.reason("ready"))

    def fail(self, job: Job, at: float, code: str, instance: str | None = None) -> None:
        job.error_code = code
        self.transition(job, at, "failed", self.actor("fail" if code != self.cfg.expiry_code else "expire",
                                                      instance), self.reason("fail"))

    # --- client side -------------------------------------------------------------------------------------------
    def upload(self, at: float, kind: str = "good", style: str | None = None) -> tuple[Job, float]:
        """An upload answered 202 (maybe after an unknown outcome and a retry with the same key). Returns the job
        and the time of the 202. ``abandoned``: the server committed it but every answer was lost and the client
        gave up — the harness never learns its id (an unknown outcome: neither lost nor successful)."""
        cfg = self.cfg
        n = self.uploads
        self.uploads += 1
        op = f"u{n:04d}"
        stem = f"{STEMS[n % len(STEMS)]}-{uid('name', n)[:8]}"
        ext = "png" if kind == "good" else "jpg"
        fields = dict(f="upload", kind=kind, sample=op, filename=f"{stem}.{ext}", format=ext, size=1000 + n,
                      sha256=uid("bytes", n).replace("-", "")[:32] * 2, idempotency_key=uid("key", n))
        invoke = self.add(at, "invoke", op=op, retry_of=None, **fields)
        style = style or self.pick(["direct", "lost_answer", "refused_first", "abandoned"])
        if style == "abandoned":
            created = at + 0.01
            self.add(at + self.dur(0.1, 1.0), "info", op=op, f="upload", error="ReadTimeout", detail="timed out")
            ok_at = at + 1.2
            self.add(ok_at, "invoke", op=f"{op}.r1", retry_of=op, **fields)
            self.add(ok_at + 0.5, "info", op=f"{op}.r1", f="upload", status=503, error_code="unavailable")
        elif style == "direct":
            created = at + self.dur(0.01, 0.1)
            ok_at, ok_op = created + self.dur(0.01, 0.2), op
        else:
            # lost_answer: committed, the answer was lost (timeout / reset); refused_first: 503 before the record.
            info_at = at + self.dur(0.1, 1.0)
            if style == "lost_answer":
                created = at + 0.01
                self.add(info_at, "info", op=op, f="upload", error="ReadTimeout", detail="timed out")
            else:
                self.add(info_at, "info", op=op, f="upload", status=503, error_code="unavailable")
            retry_at = info_at + 0.5
            ok_op = f"{op}.r1"
            self.add(retry_at, "invoke", op=ok_op, retry_of=op, **fields)
            if style == "refused_first":
                created = retry_at + 0.01
            ok_at = retry_at + self.dur(0.02, 0.2)
        att, job_id = uid("attachment", n), uid("job", n)
        job = Job(att, job_id, kind, fields["filename"], created,
                  None if cfg.ttl is None else created + cfg.ttl, size=fields["size"], invoke=invoke)
        self.transition(job, created, "queued", self.actor("create"), self.reason("create"))
        if style != "abandoned":
            job.ok = self.add(ok_at, "ok", op=ok_op, f="upload", status=202, attachment_id=att, job_id=job_id)
        self.jobs[att] = job
        return job, ok_at

    def refused(self, at: float) -> float:
        """A bad upload refused at once (415): not accepted, no record."""
        n = self.uploads
        self.uploads += 1
        op = f"u{n:04d}"
        self.add(at, "invoke", op=op, f="upload", kind="bad", sample=op, filename=f"scan-{uid('bad', n)[:8]}.txt",
                 format="txt", size=10, sha256="0" * 64, idempotency_key=uid("key", n), retry_of=None)
        self.add(at + 0.05, "fail", op=op, f="upload", status=415, error_code="unsupported_media_type")
        if self.flag():                           # staged while streaming, refused on its magic bytes: an orphan
            self.orphans.append((f"{self.cfg.staging_prefix}/{uid('refused', n)}", at + 0.02, 10))
        return at + 0.05

    # --- scripts -----------------------------------------------------------------------------------------------
    def script_for(self, job: Job, retries_ok: bool = True) -> list[str]:
        """What the coming claims of a freshly queued job do; good work never runs out of attempts."""
        left = self.attempts_left(job)          # claims after the first one
        if job.kind == "good":
            retries = self.num(0, min(2, left - 1)) if retries_ok and left > 1 else 0
            return ["retry"] * retries + ["ready"]
        if job.kind == "bad":
            return [self.pick(["fail:unsupported_image", "ready"])]
        choice = self.pick(["decode", "exhaust", "retry_then_decode"]) if retries_ok and left > 0 else "decode"
        if choice == "decode":
            return ["fail:decode_failed"]
        if choice == "retry_then_decode":
            return ["retry", "fail:decode_failed"]
        return ["retry"] * left + ["fail:attempts_exhausted"]

    def backoff(self, job: Job) -> float:
        n = max(0, job.attempt - job.base - 1)
        top = min(self.cfg.retry_cap, self.cfg.retry_base * 2 ** n)
        return self.dur(0, top)

    def run_lanes(self, jobs: list[Job], instance: str, lanes: int, start: float,
                  work=(0.2, 0.8)) -> tuple[float, list]:
        """Drain ``jobs`` (their messages queued) on ``lanes`` slots of one consumer instance, FIFO by message
        time, each claim doing the next step of the job's script. Returns (end, busy intervals)."""
        free = [start] * lanes
        busy = []
        pending = [(j.queue[0].published, i, j) for i, j in enumerate(jobs) if j.queue]
        order = len(pending)
        while pending:
            pending.sort(key=lambda p: (p[0], p[1]))
            avail, _, job = pending.pop(0)
            lane = min(range(lanes), key=lambda i: free[i])
            at = max(avail, free[lane]) + self.dur(0.02, 0.2)
            if job.state != "queued":          # expired by the sweeper meanwhile: the message is a no-op
                self.noop(min(job.queue, key=lambda m: m.published), at)
                free[lane] = at + 0.02
                continue
            msg = self.claim(job, at, instance)
            if job.expires is not None and at >= job.expires:
                end = at + self.dur(0.01, 0.05)
                self.fail(job, end, self.cfg.expiry_code, instance)
                self.ack(msg, end + 0.01)
                free[lane] = end + 0.02
                busy.append((at - 0.01, end + 0.01))
                continue
            step = job.script.pop(0)
            end = at + self.dur(*work)
            if step == "retry":
                self.requeue(job, end, self.actor("retry", instance), self.reason("retry"))
                self.ack(msg, end + 0.01)
                again = self.publish(job, end + self.backoff(job) + 0.01)
                order += 1
                pending.append((again.published, order, job))
            elif step == "ready" and job.expires is not None and end >= job.expires:
                self.write_variants(job, at, end)          # written, then the commit is refused: expired
                job.leftovers, job.written = dict(job.written), {}
                self.fail(job, end, self.cfg.expiry_code, instance)
                self.ack(msg, end + 0.01)
            elif step == "ready":
                self.commit_ready(job, at, end, instance)
                self.ack(msg, end + 0.01)
            else:
                self.fail(job, end, step.split(":", 1)[1], instance)
                self.ack(msg, end + 0.01)
            free[lane] = end + 0.02
            busy.append((at - 0.01, end + 0.01))
        for job in jobs:                        # duplicates left: delivered and acked as no-ops
            for msg in list(job.queue):
                self.noop(msg, max(msg.published, max(free)) + 0.05)
        return max(free + [start]), busy

    # --- episodes ----------------------------------------------------------------------------------------------
    def episode_flow(self) -> None:
        start = self.now
        lanes = self.num(1, min(2, self.cfg.prefetch))
        n = self.num(1, 3)
        jobs, at = [], start
        if self.flag():
            at = self.refused(at) + 0.1
        for _ in range(n):
            kind = self.pick(["good", "poison", "bad"])
            job, ok_at = self.upload(at, kind)
            job.script = self.script_for(job)
            self.publish(job, job.created + self.dur(0.01, 0.5))
            if self.flag():                     # after_publish_before_confirm: the relay publishes again
                self.publish(job, job.queue[-1].published + self.dur(0.2, 1.0))
            jobs.append(job)
            at = ok_at + self.dur(0.05, 0.6)
        if self.flag():                         # concurrent copies of the first job's message (republish "any")
            job = jobs[0]
            when = job.queue[0].line["t"] + self.dur(0.0, 0.1)
            copies = self.num(1, 3)
            idx = self.fault_index({"action": "republish"})
            self.add(when, "fault", action="republish", phase="start", jobs=[job.job_id], copies=copies, state="any")
            for _ in range(copies):
                self.publish(job, when + 0.01)
            self.add(when + 0.05, "fault", action="republish", phase="end", jobs=[job.job_id], routed=copies,
                     fault=idx)
        end, _ = self.run_lanes(jobs, self.cfg.consumer, lanes, start + 0.3)
        if self.flag():                         # copies of ready jobs' messages once idle: no-ops
            ready = [j for j in jobs if j.state == "ready"]
            if ready:
                when = end + self.dur(0.5, 1.5)
                copies = self.num(1, 2)
                self.fault_index({"action": "republish"})
                self.add(when, "fault", action="republish", phase="start", jobs=[j.job_id for j in ready],
                         copies=copies, state="ready")
                for j in ready:
                    for _ in range(copies):
                        msg = self.publish(j, when + 0.02)
                        self.noop(msg, when + 0.1)
                self.add(when + 0.2, "fault", action="republish", phase="end", jobs=[j.job_id for j in ready],
                         routed=copies * len(ready))
                end = when + 0.3
        self.now = end

    def hold(self, at: float, roles: list[str], index: int, **extra) -> list[str]:
        """The harness stops every instance of ``roles`` (expected exits) until ``release``."""
        names = [i for i in self.instances if i.split("#")[0] in roles] or roles
        for name in names:
            self.add(at, "role", role=name, action="exit", pid=2000 + len(self.events), returncode=-15,
                     expected=True, armed=None)
        self.add(at + 0.01, "phase", name="hold_start", roles=roles, instances=names, fault=index, **extra)
        return names

    def release(self, at: float, roles: list[str], names: list[str], index: int) -> None:
        for name in names:
            self.add(at, "role", role=name, action="start", pid=3000 + len(self.events), armed=None)
        self.add(at + 0.01, "phase", name="hold_end", roles=roles, instances=names, fault=index)

    def episode_crash(self) -> None:
        cfg, start = self.cfg, self.now
        C, R = cfg.consumer, cfg.recoverer
        kinds = ["sigkill"] + (["failpoint_s3", "failpoint_ack"] if cfg.failpoints else [])
        kind = self.pick(kinds)
        held = R != C and self.flag("held")
        peek = self.flag("peek")
        busy_ack = peek and self.flag()         # without a peek the depth would read as an early ack: kept
        republish = self.flag()                 # recovery publishes a new message even when one is waiting
        in_flight = self.num(1, 2) if cfg.prefetch >= 2 else 1
        before = self.num(0, 1) if cfg.prefetch >= 2 and in_flight == 1 else 0
        lanes_needed = in_flight + before
        window = {"sigkill": "after_s3_write_before_commit", "failpoint_s3": "after_s3_write_before_commit",
                  "failpoint_ack": "after_commit_before_ack"}[kind]
        action = "sigkill" if kind == "sigkill" else "failpoint"
        restart = self.dur(0.5, 3.0)
        hold_seconds = self.dur(max(1.0, 6.5 - restart) if not peek else 1.0, 6.0)
        index = self.fault_index({"action": action, "window": window, **({"hold": [R]} if held else {})})
        at = start
        if action == "failpoint":
            self.add(at, "fault", action="failpoint", phase="arm", role=C, window=window, spec="1*crash")
            self.add(at + 0.02, "role", role=C, action="exit", pid=4000 + len(self.events), returncode=-15,
                     expected=True, armed=None)
            self.add(at + 0.1, "role", role=C, action="start", pid=4100 + len(self.events),
                     armed={window: "1*crash"})
            at += 0.2
        held_names = self.hold(at, [R], index) if held else []
        at += 0.3
        jobs = []
        for _ in range(lanes_needed):
            job, ok_at = self.upload(at, "good", "direct")
            self.publish(job, job.created + self.dur(0.01, 0.2))
            jobs.append(job)
            at = ok_at + 0.05
        claim_at = max(at, max(j.queue[0].published for j in jobs)) + 0.1
        claims = []
        first_end = None
        for i, job in enumerate(jobs):
            c = claim_at + 0.05 * i
            msg = self.claim(job, c, C)
            claims.append((job, c, msg))
        if before:                               # committed (and acked) just before the crash, in the same batch
            job, c, msg = claims[0]
            first_end = c + self.dur(0.3, 0.8)
            self.commit_ready(job, c, first_end, C)
            self.ack(msg, first_end + 0.01)
            claims = claims[1:]
        crash = max(c for _, c, _ in claims) + self.dur(0.2, 0.6)
        if first_end is not None:
            crash = max(crash, first_end + self.dur(0.05, 0.3))
        crash = min(crash, min(c for _, c, _ in claims) + cfg.lease - 0.3)
        unacked_ready = None
        if kind == "failpoint_ack":              # committed, not acked: redelivery is a no-op
            job, c, msg = claims[0]
            self.commit_ready(job, c, crash - 0.03, C)
            unacked_ready = (job, msg)
            claims = claims[1:]
        elif kind == "failpoint_s3" or self.flag():
            for job, c, _ in claims:             # variants written before the crash; rewritten by redelivery
                self.write_variants(job, c, crash - 0.02)
        if kind == "sigkill" and self.flag("race"):  # the line is written just before the signal lands: a job
            job, c, msg = claims[0]               # may commit and ack in between (it was not in flight after all)
            self.commit_ready(job, c, crash + 0.002, C)
            self.ack(msg, crash + 0.003)
            job.tags.add("raced")
            claims = claims[1:]
        if kind == "sigkill":
            self.add(crash, "fault", action="sigkill", phase="start", role=C, pid=4200, window=window,
                     exactness="approximate")
            self.add(crash + 0.02, "role", role=C, action="exit", pid=4200, returncode=-9, expected=True, armed=None)
        else:
            self.add(crash, "role", role=C, action="exit", pid=4300, returncode=1, expected=False,
                     armed={window: "1*crash"})
            self.add(crash + 0.01, "fault", action="crash", phase="hit", role=C, window=window, returncode=1,
                     consumers_running=[])
        crash_wall = crash + (0.01 if kind != "sigkill" else 0.0)
        for _, _, msg in claims:                 # the broker takes the deliveries back at once
            self.ack_none_close(msg, crash)
        if unacked_ready:
            self.ack_none_close(unacked_ready[1], crash)
        back = crash + restart
        peeks = []
        if peek:
            t = crash + min(0.5, restart / 4)
            while t < back - 0.2:
                found = [{"job_id": m.job.job_id, "attachment_id": m.job.att, "attempt": m.attempt,
                          "redelivered": True}
                         for m in self.msgs if m.present(t) and not m.held(t)]
                peeks.append(self.add(t, "queue", kind="peek", queue=cfg.work_queue, messages=found,
                                      ready=len(found)))
                t += 0.6
        self.add(back, "role", role=C, action="start", pid=4400 + len(self.events), armed=None)
        hold_end = back + hold_seconds if held else None
        if held:
            self.release(hold_end, [R], held_names, index)
        self.crashes.append({"wall": crash_wall, "held": held, "peeks": peeks,
                             "in_flight": [j.att for j, _, _ in claims], "kind": kind})
        end = back + 0.1
        if unacked_ready:
            job, msg = unacked_ready
            # The harness reads the unfinished jobs while the consumer is down (FaultContext.look_while_down), and
            # traces the redelivery: the window's own evidence (fault_coverage).
            self.add(crash + 0.4, "state", attachment_id=job.att, state="ready", attempt=msg.attempt, error_code=None)
            self.add(back + 0.05, "delivery", queue=cfg.work_queue, redelivered=True, job_id=job.job_id,
                     attachment_id=job.att, attempt=msg.attempt)
            msg.deliveries.append([back + 0.05, None])
            self.ack(msg, back + 0.06)
            end = max(end, back + 0.1)
        redeliver = back + self.dur(0.03, 0.2)
        lane_free = redeliver
        for job, c, msg in claims:
            job.tags.add("crashed")
            msg.deliveries.append([redeliver, None])
            recover = (max(c + cfg.lease, hold_end or 0.0, redeliver + 0.05 if R == C else 0.0)
                       + self.dur(0.05, cfg.sweep))
            if busy_ack and recover > redeliver + 0.02:
                self.ack(msg, redeliver + 0.01)   # "busy": another (dead) owner's lease; recovery republishes
                msg = None
            who = C if R == C else R
            self.recover(job, recover, self.actor("recover", who))
            fresh = None
            if msg is None or republish:
                fresh = self.publish(job, recover + 0.02)
            if msg is not None:
                job.queue = [m for m in job.queue if m is not msg]
            claim = max(recover + 0.05, lane_free) + self.dur(0.02, 0.2)
            msg = self.claim(job, claim, C, msg)
            done = claim + self.dur(0.2, 0.8)
            self.commit_ready(job, claim, done, C)
            self.ack(msg, done + 0.01)
            if fresh is not None and fresh is not msg:   # delivered once a slot is free: ready, a no-op
                self.noop(fresh, done + 0.03)
            lane_free = done + 0.05
            end = max(end, done + 0.05)
        self.now = max(end, (hold_end or 0) + 0.1)
        if self.flag("sampled"):               # consumers sampled around the crash (batch-crash-after-partial-commit)
            self.sample_consumer(index, claim_at - 0.3, self.now, [m for m in self.msgs if m.job in jobs],
                                 down=(crash, back + 0.3))

    def sample_consumer(self, index: int, begin: float, end: float, msgs: list, down=(None, None)) -> None:
        """``consumer`` lines every 0.15 s: the instance's unacknowledged deliveries (none while it is down; a new
        consumer tag after its restart)."""
        cfg = self.cfg
        self.add(begin - 0.01, "phase", name="consumer_sampling_start", queue=cfg.work_queue, fault=index)
        self.ctags += 1
        tick, t, restarted = 0, begin, False
        while t < end:
            tick += 1
            if down[0] is not None and down[0] <= t < down[1]:
                self.add(t, "consumer", queue=cfg.work_queue, tick=tick, consumers=0)
            else:
                if down[0] is not None and t >= down[1] and not restarted:
                    restarted = True
                    self.ctags += 1
                unacked = sum(1 for m in msgs if m.held(t))
                assert unacked <= cfg.prefetch, (t, unacked)
                self.add(t, "consumer", queue=cfg.work_queue, tick=tick, consumers=1,
                         consumer_tag=f"amq.ctag-{self.ctags}",
                         channel=f"127.0.0.1:5{self.ctags} -> 127.0.0.1:5672 (1)", prefetch=cfg.prefetch,
                         unacked=unacked)
            t = round(t + 0.15, 3)
        self.add(t, "phase", name="consumer_sampling_end", ticks=tick, errors=0, last_error=None)

    def ack_none_close(self, msg: Msg, at: float) -> None:
        """The consumer died: its delivery ends, the message stays (unacked → back in the queue)."""
        for d in msg.deliveries:
            if d[1] is None:
                d[1] = at

    def episode_pause(self) -> None:
        cfg, start = self.cfg, self.now
        C, R = cfg.consumer, cfg.recoverer
        job, ok_at = self.upload(start, "good", "direct")
        msg = self.publish(job, job.created + self.dur(0.01, 0.2))
        claim = max(ok_at, msg.published) + self.dur(0.1, 0.3)
        msg = self.claim(job, claim, C)
        stop = claim + self.dur(0.05, min(0.5, cfg.lease / 2))
        self.fault_index({"action": "sigstop"})  # registers the scheduled fault
        self.add(stop, "fault", action="sigstop", phase="start", role=C, pid=5000)
        second = f"{C}#2"
        if second not in self.instances:
            self.instances.append(second)
            self.run["scenario"].setdefault("roles", {})[C] = 2
        self.add(stop + 0.5, "role", role=second, action="start", pid=5100, armed=None)
        recovered = cfg.level >= 4 or self.flag()
        if recovered:
            recover = max(claim + cfg.lease, stop + 0.6 if R == C else 0.0) + self.dur(0.05, cfg.sweep)
            self.ack_none_close(msg, recover)     # the paused owner's connection dropped; its message returns
            self.recover(job, recover, self.actor("recover", second if R == C else R))
            fresh = self.publish(job, recover + 0.02)
            new_claim = recover + self.dur(0.05, 0.3)
            msg2 = self.claim(job, new_claim, second, fresh)
            cont = stop + 2.25 * cfg.lease        # the scenario's duration: more than two leases
            assert new_claim < cont
            done = new_claim + self.dur(0.2, 3.0)  # a large image: the new owner may finish after the old one woke
            self.commit_ready(job, new_claim, done, second)
            self.ack(msg2, done + 0.01)
            self.noop(msg, done + 0.1)            # the old delivery, redelivered: ready, a no-op
            self.add(cont, "fault", action="sigcont", phase="end", role=C, pid=5000)
            end = max(cont, done) + 0.3           # the stale owner wakes: its commit is fenced, nothing written
        else:                                     # level 3 without recovery: the owner finishes when it wakes
            cont = stop + max(2.25 * cfg.lease, cfg.lease + 0.5)
            self.add(cont, "fault", action="sigcont", phase="end", role=C, pid=5000)
            done = cont + self.dur(0.1, 0.5)
            self.commit_ready(job, claim, done, C)
            self.ack(msg, done + 0.01)
            end = done + 0.1
        self.now = end

    def episode_backlog(self) -> None:
        cfg, start = self.cfg, self.now
        C = cfg.consumer
        index = self.fault_index({"action": "hold"})
        names = self.hold(start, [C], index, sample_consumers=True)
        at = start + 0.2
        jobs = []
        for _ in range(self.num(2, 6)):
            kind = self.pick(["good", "poison", "bad"])
            job, ok_at = self.upload(at, kind, "direct")
            job.script = self.script_for(job, retries_ok=False)
            self.publish(job, job.created + self.dur(0.01, 0.1))
            jobs.append(job)
            at = ok_at + self.dur(0.0, 0.2)
        release = at + self.dur(0.2, 1.0)
        self.release(release, [C], names, index)
        self.add(release + 0.02, "phase", name="consumer_sampling_start", queue=cfg.work_queue, fault=index)
        lanes = self.num(1, cfg.prefetch)
        end, busy = self.run_lanes(jobs, names[0], lanes, release + 0.3, work=(0.3, 0.9))
        self.ctags += 1
        tag = f"amq.ctag-{self.ctags}"
        tick, t = 0, release + 0.15
        while t < end + 0.3:
            tick += 1
            if t < release + 0.3:
                self.add(t, "consumer", queue=cfg.work_queue, tick=tick, consumers=0)
            else:
                unacked = sum(1 for s, e in busy if s <= t < e)
                self.add(t, "consumer", queue=cfg.work_queue, tick=tick, consumers=1, consumer_tag=tag,
                         channel=f"127.0.0.1:5{self.ctags} -> 127.0.0.1:5672 (1)", prefetch=lanes, unacked=unacked)
            t = round(t + 0.15, 3)
        self.add(t, "phase", name="consumer_sampling_end", ticks=tick, errors=0, last_error=None)
        self.now = t + 0.1
        if self.flag():
            checks = self.run["scenario"]["checks"]
            for name in ("bounded_concurrency", "batch_independence"):
                if name not in checks:
                    checks.append(name)

    def episode_orphan(self) -> None:
        cfg, start = self.cfg, self.now
        window = self.pick(["after_staging_before_record", "after_commit_before_publish"])
        how = self.pick(["failpoint", "sigkill"]) if cfg.failpoints else "sigkill"
        host = cfg.api if (window == "after_staging_before_record" or not cfg.relay) else cfg.relay
        self.fault_index({"action": how, "window": window})
        n = self.uploads
        self.uploads += 1
        op = f"u{n:04d}"
        fields = dict(f="upload", kind="good", sample=op, filename=f"avatar-{uid('name', n)[:8]}.png", format="png",
                      size=2000, sha256="e" * 64, idempotency_key=uid("key", n))
        self.add(start, "invoke", op=op, retry_of=None, **fields)
        staged = start + self.dur(0.05, 0.3)
        died = staged + 0.02
        if how == "sigkill":
            self.add(died, "fault", action="sigkill", phase="start", role=host, pid=6000, window=window,
                     exactness="approximate")
            self.add(died + 0.01, "role", role=host, action="exit", pid=6000, returncode=-9, expected=True, armed=None)
        else:
            self.add(died, "role", role=host, action="exit", pid=6000, returncode=1, expected=False,
                     armed={window: "1*crash"})
            self.add(died + 0.01, "fault", action="crash", phase="hit", role=host, window=window, returncode=1)
        back = died + self.dur(0.5, 1.5)
        self.add(back, "role", role=host, action="start", pid=6100, armed=None)
        if window == "after_staging_before_record":
            self.add(died + 0.02, "info", op=op, f="upload", error="RemoteProtocolError", detail="disconnected")
            self.orphans.append((f"{cfg.staging_prefix}/{uid('orphan', n)}", staged, fields["size"]))
            retry = back + 0.3                    # the client's retry (same key) makes a record of its own
            self.add(retry, "invoke", op=f"{op}.r1", retry_of=op, **fields)
            created = retry + 0.02
            att, job_id = uid("attachment", n), uid("job", n)
            job = Job(att, job_id, "good", fields["filename"], created, None if cfg.ttl is None else created + cfg.ttl,
                      size=fields["size"])
            self.transition(job, created, "queued", self.actor("create"), self.reason("create"))
            job.ok = self.add(retry + 0.05, "ok", op=f"{op}.r1", f="upload", status=202, attachment_id=att,
                              job_id=job_id)
            publish = created + self.dur(0.01, 0.3)
        else:                                     # committed: the relay publishes once it is back
            created = staged + 0.01
            att, job_id = uid("attachment", n), uid("job", n)
            job = Job(att, job_id, "good", fields["filename"], created, None if cfg.ttl is None else created + cfg.ttl,
                      size=fields["size"])
            self.transition(job, created, "queued", self.actor("create"), self.reason("create"))
            if host == cfg.api:
                self.add(died + 0.02, "info", op=op, f="upload", error="RemoteProtocolError", detail="disconnected")
                job.ok = self.add(back + 0.35, "ok", op=f"{op}.r1", f="upload", status=202, attachment_id=att,
                                  job_id=job_id)
                self.add(back + 0.3, "invoke", op=f"{op}.r1", retry_of=op, **fields)
            else:
                job.ok = self.add(created + 0.05, "ok", op=op, f="upload", status=202, attachment_id=att,
                                  job_id=job_id)
            publish = back + self.dur(0.1, 0.5)
        self.jobs[att] = job
        job.script = ["ready"]
        self.publish(job, publish)
        end, _ = self.run_lanes([job], cfg.consumer, 1, publish)
        self.now = end

    def episode_replay(self) -> None:
        """Poison (and a good job whose transient errors ran out of attempts) fail; then the harness replays every
        failed attachment, as the runner does once the system is idle."""
        cfg, start = self.cfg, self.now
        jobs, at = [], start
        for _ in range(self.num(1, 2)):
            kind = self.pick(["poison", "good"])
            job, ok_at = self.upload(at, kind, "direct")
            left = self.attempts_left(job)
            if kind == "good":
                job.script = ["retry"] * left + ["fail:attempts_exhausted"]
            else:
                job.script = self.script_for(job)
            self.publish(job, job.created + self.dur(0.01, 0.2))
            jobs.append(job)
            at = ok_at + 0.1
        end, _ = self.run_lanes(jobs, cfg.consumer, 1, start + 0.3)
        self.fault_index({"action": "replay"})
        at = end + self.dur(0.5, 1.5)
        failed = [j for j in self.jobs.values() if j.state == "failed" and j.ok is not None]  # what it saw failed
        again = []
        for job in failed:
            op = f"replay-{job.att[:8]}"
            self.add(at, "invoke", op=op, f="replay", attachment_id=job.att)
            job.base = job.attempt                         # a fresh attempt budget
            self.requeue(job, at + 0.03, self.actor("replay"), self.reason("replay"))
            answer = job.attempt + (1 if job.pending else 0)
            self.add(at + 0.05, "ok", op=op, f="replay", attachment_id=job.att, status=202,
                     unauthenticated_status=self.pick([401, 403]), job_id=job.job_id, attempt=answer)
            job.tags.add("replayed")
            job.error_code = None
            if job.kind == "good" and job.trans[-2]["to"] == "failed" and job.trans[-3]["to"] == "processing" \
                    and job.trans[-2].get("reason") != "expired":
                job.script = ["retry"] * self.num(0, 1) + ["ready"]
            elif job.kind == "good":
                job.script = ["ready"]
            elif job.kind == "bad":
                job.script = [self.pick(["fail:unsupported_image", "ready"])]
            else:                                          # poison again: fails, maybe after exhausting again
                job.script = self.pick([["fail:decode_failed"], ["retry"] * self.attempts_left(job)
                                        + ["fail:attempts_exhausted"]])
            self.publish(job, at + 0.06)
            again.append(job)
            at += 0.1
        end, _ = self.run_lanes(again, self.instances[-1], 1, at + 0.1)
        self.now = end

    def episode_expiry(self) -> None:
        """Consumers held past the TTL while uploads arrive (the run's ttl is short)."""
        cfg, start = self.cfg, self.now
        C, R = cfg.consumer, cfg.recoverer
        ttl = cfg.ttl
        self.run["scenario"]["checks"].append("expiry")
        index = self.fault_index({"action": "hold"})
        names = self.hold(start, [C], index)
        sweeper = R != C and self.flag()          # queued→failed by the sweeper, or processing→failed by a worker
        at = start + 0.2
        jobs = []
        for i in range(self.num(1, 3)):             # the first is good: the expiry of good work is what is proven
            job, ok_at = self.upload(at, self.pick(["good", "poison"]) if i else "good", "direct")
            jobs.append(job)
            at = ok_at + self.dur(0.1, 0.4)
        release = max(at, max(j.ok["t"] for j in jobs) + ttl + 0.1) + self.dur(0.05, 0.5)
        for _ in range(self.num(0, 2)):            # ambiguous: their TTL runs out around the release
            up = release - self.dur(0.05, min(ttl, 1.5))
            if up <= at:
                break
            job, ok_at = self.upload(up, "good", "direct")
            jobs.append(job)
            at = ok_at + 0.01
        for job in jobs:
            job.script = ["ready"] if job.kind == "good" else ["fail:decode_failed"]
            self.publish(job, job.created + self.dur(0.01, 0.1))
        self.release(release, [C], names, index)
        first_claim = release + self.dur(0.2, 0.5)
        if sweeper:                                # the sweeper runs on: expires what waited past its TTL
            for job in jobs[:-1]:
                when = job.expires + self.dur(0.01, cfg.sweep)
                if when < first_claim:
                    self.fail(job, when, cfg.expiry_code, R)
        end, _ = self.run_lanes(jobs, names[0], 1, first_claim - 0.1, work=(0.1, 0.4))
        fresh_at = end + 0.1
        fresh = []
        for _ in range(self.num(1, 2)):
            job, ok_at = self.upload(fresh_at, "good", "direct")
            job.script = ["ready"]
            self.publish(job, job.created + 0.02)
            fresh.append(job)
            end, _ = self.run_lanes([job], names[0], 1, ok_at, work=(0.1, min(0.5, ttl / 3)))
            fresh_at = end + 0.1
        self.now = end

    # --- the end: final state and history lines ----------------------------------------------------------------
    def finish(self) -> tuple[History, dict, dict]:
        cfg, rng = self.cfg, random.Random(self.rng.random())
        read_at = self.now + 2.0
        seq = 0
        variants_names = LEVEL_VARIANTS[min(cfg.level, 4)]
        listing = []
        for job in self.jobs.values():
            assert job.state in ("ready", "failed") or "lost" in job.tags, (job.att, job.state, job.trans)
            known = job.ok is not None             # the harness polls and reads only what it got a 202 for
            events = []
            polled = 0.0
            seen = 0.0
            for i, t in enumerate(job.trans):
                seq = seq + 1 if cfg.seq_style == "global" else i + 1
                events.append({"seq": seq, "at": iso(T0 + t["at"], cfg.time_style), "from": t["from"], "to": t["to"],
                               "attempt": t["attempt"], "reason": t["reason"], "actor": t["actor"]})
                seen = max(seen, t["at"] + rng.uniform(0.02, 0.3))
                if cfg.events and known:
                    self.add(seen, "transition", attachment_id=job.att, event_seq=seq, at_server=events[-1]["at"],
                             attempt=t["attempt"], actor=t["actor"], reason=t["reason"],
                             **{"from": t["from"], "to": t["to"]})
                polled = max(polled, t["at"] + rng.uniform(0.02, 0.3))
                if known and (i == len(job.trans) - 1 or rng.random() < 0.6):
                    self.add(polled, "state", attachment_id=job.att, state=t["to"], attempt=t["attempt"],
                             error_code=job.error_code if t["to"] == "failed" else None)
            if cfg.layout == "split":
                original_key = f"{cfg.staging_prefix}/{job.att}"
                key_of = lambda name, job=job: f"{cfg.variant_prefix}/{job.att}/1/{name}.webp"
            else:
                original_key = f"{cfg.staging_prefix}/{job.att}/original"
                key_of = lambda name, job=job: f"{cfg.staging_prefix}/{job.att}/v1-{name}.webp"
            digest = lambda *p: uuid.uuid5(NS, "/".join(map(str, p))).hex * 2
            original = {"key": original_key, "sha256": digest(job.att, "original"), "size": job.size,
                        "content_type": "image/png"}
            variants = []
            objects = {}
            released = job.state == "failed" and self.release_failed
            objects[original_key] = ({"exists": False} if released else
                                     {"exists": True, "sha256": original["sha256"], "size": job.size,
                                      "last_modified": iso(math.floor(T0 + job.created))})
            if not released:
                listing.append({"key": original_key, "size": job.size,
                                "last_modified": iso(math.floor(T0 + job.created))})
            for name, when in sorted(job.written.items()):
                key = key_of(name)
                obj = {"exists": True, "sha256": digest(job.att, name), "size": 10 + len(name),
                       "last_modified": iso(math.floor(T0 + when))}
                listing.append({"key": key, "size": obj["size"], "last_modified": obj["last_modified"]})
                if job.state == "ready":
                    objects[key] = obj
                    variants.append({"name": name, "key": key, "sha256": obj["sha256"], "size": obj["size"],
                                     "content_type": "image/webp"})
            for name, when in sorted(job.leftovers.items()):
                listing.append({"key": key_of(name), "size": 5, "last_modified": iso(math.floor(T0 + when))})
            assert job.state != "ready" or sorted(v["name"] for v in variants) == sorted(variants_names), job.att
            body = {"attachment_id": job.att, "state": job.state, "pipeline_version": 1, "attempt": job.attempt,
                    "error_code": job.error_code if job.state == "failed" else None, "original": original,
                    "variants": variants, "created_at": iso(T0 + job.created, cfg.time_style),
                    "updated_at": iso(T0 + job.trans[-1]["at"], cfg.time_style)}
            if known:
                self.attachments[job.att] = {"status": 200, "body": body, "objects": objects,
                                             **({"events": events} if cfg.events else {})}
        grace = cfg.retention + 2 * cfg.sweep + 2
        for key, when, size in self.orphans:             # still there only while young
            if (T0 + read_at) - math.floor(T0 + when) < grace - 1:
                listing.append({"key": key, "size": size, "last_modified": iso(math.floor(T0 + when))})
        t = 0.3
        while t < self.now + 1:
            ready = sum(1 for m in self.msgs if m.present(t) and not m.held(t))
            unacked = sum(1 for m in self.msgs if m.present(t) and m.held(t))
            self.add(t, "queue", queue=cfg.work_queue, dead_letter=False, ready=ready, unacked=unacked)
            t = round(t + rng.uniform(0.4, 0.9), 3)
        assert all(m.acked is not None for m in self.msgs), [m.job.att for m in self.msgs if m.acked is None]
        # After the drain the harness reads every /metrics once: the expired jobs, counted by whichever role
        # expired them (split at random: the sum is what the contract asks for).
        expired = sum(1 for a in self.attachments.values() if a["body"]["error_code"] == cfg.expiry_code)
        by_consumer = rng.randint(0, expired)
        for instance, value in ((cfg.consumer, by_consumer), (cfg.recoverer, expired - by_consumer)):
            self.add(read_at - 0.5, "metrics", instance=instance, role=instance, url=f"http://127.0.0.1:1/{instance}",
                     alive=True, ok=True, values={"jobs_expired_total": float(value)})
        self.final.update(read_ok=True, errors=[], bucket_objects=listing, read_at=iso(T0 + read_at),
                          queues={"work": {"ready": 0, "unacked": 0}})
        order = sorted(range(len(self.events)), key=lambda i: (self.events[i]["t"], i))
        self.events = [self.events[i] for i in order]
        for number, event in enumerate(self.events, start=1):
            event["seq"] = event["line"] = number
        self.finished = (History(tuple(self.events)), self.final, self.run)
        return self.finished


@st.composite
def configs(draw, level=None, expiry=False, failpoints=None, replay=None, events=None, own_recoverer=False):
    level = level or draw(st.sampled_from([3, 4, 5]))
    consumer = draw(st.sampled_from(CONSUMER_NAMES))
    recoverer = draw(st.sampled_from(RECOVERY_NAMES + ([] if own_recoverer else [consumer])))
    word = st.one_of(st.sampled_from(WORDS), st.text("abcdefghijklmnopqrstuvwxyz0123456789:-_ ", max_size=12))
    words = {k: draw(word) for k in ("create", "claim", "retry", "recover", "ready", "fail", "replay", "expire")}
    words["with_instance"] = draw(st.booleans())
    for k in ("create", "claim", "retry", "recover", "ready", "fail", "replay"):
        words[f"reason_{k}"] = draw(st.sampled_from(REASONS))
    layout = draw(st.sampled_from(["split", "shared"]))
    extras = draw(st.dictionaries(st.sampled_from(sorted(EXTRA_FIELDS)), st.just(None), max_size=3))
    convention = draw(st.sampled_from(["queue", "claim"]))
    return Config(
        level=level, lease=draw(st.sampled_from([2, 3, 4])), max_attempts=draw(st.integers(2, 6)),
        retry_base=0.2, retry_cap=draw(st.sampled_from([1, 2])), sweep=draw(st.sampled_from([0.5, 1])),
        retention=draw(st.sampled_from([5, 10])), ttl=draw(st.sampled_from([1.5, 2, 3])) if expiry else
        draw(st.sampled_from([None, 86400])), expiry_code=draw(st.sampled_from(["expired", "job_expired"])),
        convention=convention, consumer=consumer, recoverer=recoverer,
        api=draw(st.sampled_from(API_NAMES)), relay=draw(st.sampled_from([None, "relay", "outbox"])),
        prefetch=draw(st.integers(1, 3)), layout=layout,
        staging_prefix=draw(st.sampled_from(["staging", "incoming", "att"])),
        variant_prefix=draw(st.sampled_from(["variants", "derived"])), work_queue=draw(st.sampled_from(
            ["attachments.jobs.process", "jobs", "work"])), words=words,
        extras={k: EXTRA_FIELDS[k] for k in extras}, message_id=draw(st.sampled_from(["job", "fresh", "none"])),
        message_attempt=draw(st.sampled_from(["current", "coming"])),
        seq_style=draw(st.sampled_from(["per_attachment", "global"])),
        time_style=draw(st.sampled_from(["Z", "+00:00"])),
        failpoints=draw(st.booleans()) if failpoints is None else failpoints,
        replay=(level >= 4 and draw(st.booleans())) if replay is None else replay,
        events=draw(st.sampled_from([True, True, True, False])) if events is None else events,
        recovery_new_attempt=draw(st.booleans()))


EPISODES = ("flow", "crash", "pause", "backlog", "orphan")


@st.composite
def models(draw, require: tuple[str, ...] = (), expiry: bool | None = None, level=None, force=None,
           **config_kwargs):
    """A played-out model of a correct run (not yet finished: mutations edit it first). ``require`` forces
    episodes in; ``expiry=True`` makes it an expiry run; ``force`` pins named choices (``held``, ``peek``,
    ``race`` of a crash)."""
    expiry = draw(st.sampled_from([False, False, False, True])) if expiry is None else expiry
    if "replay" in require:
        level, config_kwargs["replay"] = 4, True
    cfg = draw(configs(level=level, expiry=expiry, **config_kwargs))
    model = PipelineModel(cfg, draw, draw(st.integers(0, 2 ** 32 - 1)))
    model.force = dict(force or {})
    if expiry:
        plan = ["expiry"]
    else:
        # Each kind in or out on its own (a crash next to a backlog next to an orphan...), in a drawn order.
        chosen = [e for e in EPISODES if e != "pause" and draw(st.booleans())]
        plan = [e for e in list(require) + chosen if e not in ("pause", "replay")] or ["flow"]
        plan = list(draw(st.permutations(plan)))
        if "pause" in require or draw(st.booleans()):
            plan.append("pause")                 # its second consumer instance stays: after every other consumer
        if cfg.replay and ("replay" in require or draw(st.booleans())):
            plan.append("replay")
    for episode in plan:
        model.episodes.append(episode)
        getattr(model, f"episode_{episode}")()
        model.now += draw(st.integers(20, 30))   # a quiet gap: each crash window sees only its own episode
    model.release_failed = draw(st.booleans())
    return model


def build(model: PipelineModel) -> tuple[History, dict, dict]:
    return model.finished or model.finish()
