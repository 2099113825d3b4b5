"""A grade folder made up for report tests: no service, no checker — the files a grade leaves, written directly.

``build(folder)`` writes ``grade-…/`` with two scenarios and returns the grade folder:

- ``prefetch-under-backlog``: 50 attachments uploaded while the worker is held, then drained (a backlog: queue depth
  falls, one consumer at its prefetch), one retried after a SIGKILL of the worker, three poison items failed;
- ``window-commit-publish-failpoint``: 5 attachments, a failpoint crash in the API and a cut to S3, one attachment
  lost (still queued at the end) — the scenario and BE-JOB-001 fail, so the page shows red.

Each scenario folder has history.jsonl, run.json, final.json, results.json, summary.md and timeline.html stubs; the
grade's reports (results.json, summary.md, junit.xml, timeline.html, index.html) come from the harness's own
``aggregate`` and ``write_grade_reports``, so results.json validates against the report schema.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone
from pathlib import Path

from harness.grade import aggregate, scenario_entry
from harness.report import write_grade_reports

WALL0 = 1_796_000_000.0
SEED = 424242
PHASES = ("setup", "start_roles", "faults_and_workload", "heal", "drain", "final_read", "stop")


def iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).isoformat().replace("+00:00", "Z")


class Hist:
    def __init__(self):
        self.lines: list[dict] = []

    def add(self, t: float, type_: str, **fields) -> dict:
        line = {"seq": len(self.lines) + 1, "t": round(t, 6), "wall": round(WALL0 + t, 6), "type": type_, **fields}
        self.lines.append(line)
        return line

    def text(self) -> str:
        ordered = sorted(self.lines, key=lambda e: (e["t"], e["seq"]))
        for seq, line in enumerate(ordered, start=1):
            line["seq"] = seq
        return "".join(json.dumps(line, sort_keys=True) + "\n" for line in ordered)


def _attachment(h: Hist, rng: random.Random, index: int, accepted: float, path: list[tuple[float, str]],
                kind: str = "good") -> str:
    aid = f"{rng.getrandbits(32):08x}-{index:04x}-4000-8000-{rng.getrandbits(48):012x}"
    op = f"u{index:04d}"
    h.add(accepted - 0.02, "invoke", op=op, f="upload", sample=op, kind=kind, filename=f"{op}.png")
    h.add(accepted, "ok", op=op, f="upload", attachment_id=aid, job_id=f"job-{index}", status=202)
    previous = None
    for n, (t, state) in enumerate(path, start=1):
        h.add(t + 0.15, "transition", attachment_id=aid, to=state, **{"from": previous}, at_server=iso(WALL0 + t),
              attempt=1 if state != "queued" else 0, actor="worker" if state != "queued" else "intake", event_seq=n,
              reason="accepted" if state == "queued" else None)
        h.add(t + 0.2, "state", attachment_id=aid, state=state, attempt=1)
        previous = state
    return aid


def _verdict(invariant: str, status: str, requirements: list[str], summary: str, evidence=()) -> dict:
    return {"invariant": invariant, "status": status, "requirements": requirements, "summary": summary,
            "exercised": True, "seed": SEED, "evidence": list(evidence)}


def _scenario(grade_dir: Path, name: str, description: str, requirements: list[str], windows: list[str],
              h: Hist, timings: dict, verdicts: list[dict], level: int = 3) -> dict:
    run_dir = grade_dir / name
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "history.jsonl").write_text(h.text())
    scenario = {"name": name, "description": description, "windows": windows, "requirements": requirements,
                "level": level, "exactness": "exact" if windows else None, "checks": [v["invariant"] for v in verdicts]}
    run = {"run_id": name, "scenario": scenario, "seed": SEED, "level": 4, "timings": timings, "error": None,
           "adapter": {"name": "synthetic", "path": "/nowhere/adapter.toml", "level": 4}}
    (run_dir / "run.json").write_text(json.dumps(run, indent=1))
    (run_dir / "final.json").write_text(json.dumps({"read_ok": True, "attachments": {}}))
    verdict = "invalid" if any(v["status"] == "invalid" for v in verdicts) else "valid"
    result = {"report_version": 1, "kind": "scenario", "run_id": name, "scenario": scenario, "seed": SEED, "level": 4,
              "sut": {"name": "synthetic", "path": "/nowhere/adapter.toml", "level": 4}, "verdict": verdict,
              "error": None, "verdicts": verdicts, "timings": timings,
              "reproduce": f"harness run {name} --seed {SEED} --sut /nowhere/adapter.toml --level 4"}
    (run_dir / "results.json").write_text(json.dumps(result, indent=1))
    for page in ("summary.md", "timeline.html"):
        (run_dir / page).write_text(f"{name} {page}\n")
    return scenario_entry(result, run_dir, grade_dir, sum(timings.values()))


def backlog_history(uploads: int = 50) -> Hist:
    rng = random.Random(7)
    h = Hist()
    h.add(0.0, "note", message="run start")
    h.add(0.01, "phase", name="setup_start")
    for role, pid in (("api", 1001), ("worker", 1002), ("sweeper", 1003)):
        h.add(1.0, "role", action="start", role=role, pid=pid)
    h.add(1.2, "phase", name="hold_start", roles=["worker"], instances=["worker"], fault=0)
    done_at = 6.0
    for i in range(uploads):
        accepted = 1.3 + i * 0.06
        kind = "poison" if i in (0, 24, 49) else "good"
        start = max(done_at, 6.0)
        if kind == "poison":
            path = [(accepted + 0.01, "queued"), (start, "processing"), (start + 0.3, "failed")]
            done_at = start + 0.3
        elif i == 10:  # SIGKILLed while processing: back to queued, then done
            path = [(accepted + 0.01, "queued"), (start, "processing"), (start + 2.5, "queued"),
                    (start + 4.0, "processing"), (start + 4.6, "ready")]
            done_at = start + 0.4
        else:
            took = 0.25 + rng.random() * 0.3
            path = [(accepted + 0.01, "queued"), (start, "processing"), (start + took, "ready")]
            done_at = start + took * 0.5
        _attachment(h, rng, i, accepted, path, kind)
    h.add(6.0, "phase", name="hold_end", roles=["worker"], instances=["worker"], fault=0)
    h.add(6.2, "phase", name="consumer_sampling_start", queue="work", fault=0)
    h.add(8.1, "fault", action="sigkill", phase="start", role="worker", pid=1002)
    h.add(8.1, "role", action="exit", role="worker", pid=1002, returncode=-9, expected=True)
    h.add(8.7, "role", action="start", role="worker", pid=1004)
    for tick in range(int(done_at * 2) + 4):
        t = 1.0 + tick * 0.5
        ready = max(0, uploads - max(0, int((t - 6.0) / (done_at - 6.0) * uploads))) if t >= 6 else min(
            uploads, int((t - 1.3) / 0.06) if t > 1.3 else 0)
        h.add(t, "queue", queue="work", dead_letter=False, ready=ready, unacked=2 if 6 <= t <= done_at else 0,
              consumers=1 if t >= 6 else 0)
        h.add(t + 0.01, "queue", queue="work.dead", dead_letter=True, ready=3 if t > done_at - 1 else 0, unacked=0,
              consumers=0)
        if t >= 6.2:
            h.add(t + 0.02, "consumer", queue="work", tick=tick, consumers=1, consumer_tag="worker-ctag-1",
                  channel="ch 1", prefetch=2, unacked=2 if t <= done_at else 0)
    h.add(done_at + 2.0, "phase", name="drain_end")
    return h


def lost_work_history() -> tuple[Hist, str]:
    rng = random.Random(11)
    h = Hist()
    h.add(0.0, "note", message="run start")
    h.add(0.5, "fault", action="failpoint", phase="arm", role="api", window="after_commit_before_publish",
          spec="1*crash")
    ids = []
    for i in range(5):
        accepted = 1.0 + i * 0.3
        path = [(accepted + 0.02, "queued")] if i == 2 else [(accepted + 0.02, "queued"), (accepted + 0.6, "processing"),
                                                             (accepted + 1.1, "ready")]
        ids.append(_attachment(h, rng, i, accepted, path))
    h.add(1.62, "fault", action="crash", phase="hit", role="api", window="after_commit_before_publish", returncode=137)
    h.add(2.5, "fault", action="toxic", toxic="cut", phase="start", service="s3")
    h.add(4.0, "fault", action="toxic", toxic="cut", phase="end", service="s3")
    h.add(9.0, "phase", name="drain_end")
    return h, ids[2]


def build(folder: Path, uploads: int = 50) -> Path:
    grade_dir = Path(folder) / f"grade-20261130T120000-synthetic-L4-s{SEED}"
    grade_dir.mkdir(parents=True, exist_ok=True)
    backlog = _scenario(
        grade_dir, "prefetch-under-backlog",
        "Every consumer is held while a backlog piles up, then started: the consumer never holds more than its prefetch.",
        ["BE-JOB-004"], [], backlog_history(uploads),
        {"setup": 1.1, "start_roles": 0.3, "faults_and_workload": 4.9, "heal": 0.1, "drain": 9.8, "final_read": 2.2,
         "stop": 0.1, "check": 0.2},
        [_verdict("bounded_concurrency", "valid", ["BE-JOB-004"], "at most 2 unacked per consumer (prefetch 2)"),
         _verdict("lost_accepted_work", "valid", ["BE-JOB-001"], f"{uploads} accepted, all terminal")])
    history, lost = lost_work_history()
    window = _scenario(
        grade_dir, "window-commit-publish-failpoint",
        "The API crashes between the commit and the publish: the outbox must publish the job anyway.",
        ["BE-JOB-001", "BE-JOB-002"], ["after_commit_before_publish"], history,
        {"setup": 0.9, "start_roles": 0.4, "faults_and_workload": 2.8, "heal": 0.2, "drain": 3.1, "final_read": 0.6,
         "stop": 0.1, "check": 0.1},
        [_verdict("lost_accepted_work", "invalid", ["BE-JOB-001"], "1 accepted upload never reached a terminal state",
                  [{"message": "accepted but still queued after draining", "attachment_id": lost, "lines": [12]}]),
         _verdict("duplicate_effects", "valid", ["BE-JOB-002"], "no effect repeated")], level=4)
    results = aggregate(grade_dir, {"name": "synthetic", "path": "/nowhere/adapter.toml", "level": 4}, 4, SEED,
                        [backlog, window], [{"name": "expiry-after-backlog", "reason": "adapter cannot set "
                                             "job_ttl_seconds", "level": 4, "requirements": ["BE-JOB-005"]}],
                        {"stack_start": 14.2, "total": 42.0},
                        {"BE-JOB-001": ["window-commit-publish-failpoint"], "BE-JOB-002": ["window-commit-publish-failpoint"],
                         "BE-JOB-004": ["prefetch-under-backlog"], "BE-JOB-005": ["expiry-after-backlog"]})
    write_grade_reports(grade_dir, results)
    return grade_dir
