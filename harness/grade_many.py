"""`harness grade-many`: grade a class of submissions, one after another, on ONE shared stack; one table for all.

Each argument is an adapter file, a folder holding ``adapter.toml`` (one submission), or a folder of submissions
(every sub-folder holding an ``adapter.toml`` is one, in name order). Every submission is checked first with the
logic of ``harness adapter check`` — one with problems is a row ``invalid adapter`` with the first problems as its
reason, and nothing is started for it. The others are graded by ``grade()`` on the shared stack (each scenario on a
fresh tenant) with the same base seed, each within a time limit:

- a grade that ends is a row with its verdict and each requirement's status (BE-JOB-001 … 007);
- a submission whose first scenario cannot start it (setup fails, the API never healthy) is a row
  ``did not start`` with the run error and the last line of its log; its other scenarios are not tried;
- a submission past its time limit is stopped — each grade runs in a child process of its own
  (harness/grade_child.py); the child is told to stop (its grade's teardown stops its roles), then kills by PID
  every process still running below it (each process group it leads), and a child that does not exit in time is
  killed with its whole tree — and its row says ``timeout``; the scenarios that finished keep their report;
- anything else that goes wrong is a row ``error`` with the exception: never a crash of the whole run.

The table is rewritten after every submission (``table.md``, ``table.csv``, ``index.html`` and ``results.json``
in ``<reports>/grade-many-<stamp>-L<level>-s<seed>/``), next to one folder per submission holding its grade and its
feedback page; the class table (``class.csv``, ``class.html``, ``class.json``: every checklist row, the level
achieved, the time, the reproduce command) is harness/class_table.py's.

``--jobs N`` grades N submissions at once on the one stack (a :class:`RunGate`, file locks shared by the
processes, lets a scenario that restarts a shared service, and the tidy-up between submissions, run alone);
``--shard i/n`` grades the i-th of n round-robin slices of the submission list sorted by name; ``grade-many merge DIR...`` joins shards into one class table.
Exit code: 0 when every submission is valid, 1 if any is invalid or tampered, 2 otherwise (unknown, not proven, not
graded), 3 when the shared stack did not start (twice): harness/errors.py.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import adapter as adapter_mod
from . import scenarios as catalogue_mod
from .grade_child import (DidNotStart, FileGate, SubmissionTimeout, _stat, answer, child_main, kill_tree,  # noqa: F401
                          roles_running, start_problem)  # re-exported: what the parent reads of a child's grade folder
from .report import table
from .runner import REPORTS_DIR

DEFAULT_TIMEOUT = 1800.0
GRACEFUL_STOP_SECONDS = 20.0  # for the interrupted grade's own teardown, before its process tree is killed
SERVICES = ("postgres", "rabbitmq", "s3", "toxiproxy")


@dataclass
class Submission:
    name: str
    adapter: Path | None  # the adapter file; None when the argument names none
    given: str
    problem: str | None = None

    @property
    def shown_path(self) -> str:
        path = self.adapter or Path(self.given)
        try:
            return str(path.resolve().relative_to(Path.cwd()))
        except ValueError:
            return str(path)


# --- which submissions ----------------------------------------------------------------------------------------------

def discover(arguments: list[str]) -> list[Submission]:
    """The submissions named by the arguments, in order; names made unique (``name-2``)."""
    found: list[Submission] = []
    for given in arguments:
        path = Path(given)
        if path.is_file():
            found.append(Submission(path.parent.name if path.name == "adapter.toml" else path.stem, path, given))
        elif path.is_dir() and (path / "adapter.toml").is_file():
            found.append(Submission(path.resolve().name, path / "adapter.toml", given))
        elif path.is_dir():
            subs = sorted(p for p in path.iterdir() if p.is_dir() and (p / "adapter.toml").is_file())
            if not subs:
                found.append(Submission(path.resolve().name, None, given,
                                        f"no adapter.toml in {given} nor in any of its sub-folders"))
            found += [Submission(p.name, p / "adapter.toml", str(p)) for p in subs]
        else:
            try:  # a name such as `reference` (from a checkout)
                resolved = adapter_mod.resolve_path(given)
                found.append(Submission(resolved.parent.name, resolved, given))
            except adapter_mod.AdapterError as exc:
                found.append(Submission(path.name or given, None, given, str(exc)))
    seen: dict[str, int] = {}
    for s in found:
        seen[s.name] = seen.get(s.name, 0) + 1
        if seen[s.name] > 1:
            s.name = f"{s.name}-{seen[s.name]}"
    return found


# --- processes: ours, by PID ------------------------------------------------------------------------------------------

def _ticks_now() -> int:
    """Now, in the clock ticks since boot that /proc/<pid>/stat's start time uses."""
    with open("/proc/uptime", encoding="ascii") as f:
        return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


def our_children(since_ticks: int | None = None, exclude: set[int] = frozenset()) -> dict[int, list[str]]:
    """This process's direct children (started at or after ``since_ticks``), minus ``exclude``: pid -> stat."""
    me = os.getpid()
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        fields = _stat(int(entry))
        if not fields or fields[0] == "Z":
            continue
        try:
            ppid, start = int(fields[1]), int(fields[19])
        except (IndexError, ValueError):
            continue
        if ppid == me and (since_ticks is None or start >= since_ticks):
            out[int(entry)] = fields
    return out


# Several submissions on one stack (--jobs N), each grade in its own process: the gate is a pair of file locks
# (harness/grade_child.py), released by the kernel when a holder dies.
RunGate = FileGate


# --- one submission ---------------------------------------------------------------------------------------------------

def partial_grade(folder: Path, adapter, level: int, seed: int, only: list[str] | None, why: str,
                  seconds: float) -> tuple[dict, Path] | None:
    """The grade reports of an interrupted grade, from the scenarios that finished; the others listed as not run
    with ``why``. None when the grade never created its folder."""
    from .grade import aggregate, plan, scenario_entry, skipped_entry
    from .report import write_grade_reports

    grades = sorted(p for p in folder.glob("grade-*") if p.is_dir())
    if not grades:
        return None
    grade_dir = grades[-1]
    chosen, skipped, required, required_items = plan(adapter, level, only)
    entries = []
    for scenario in chosen:
        stored = grade_dir / scenario.name / "results.json"
        if stored.is_file():
            result = json.loads(stored.read_text())
            took = sum(v for v in (result.get("timings") or {}).values() if isinstance(v, (int, float)))
            entries.append(scenario_entry(result, grade_dir / scenario.name, grade_dir, took))
        else:
            skipped.append(skipped_entry(scenario, f"not run: {why}"))
    results = aggregate(grade_dir, adapter.summary(), level, seed, entries, skipped, {"total": round(seconds, 2)},
                        required, required_items)
    write_grade_reports(grade_dir, results)
    return results, grade_dir


class SubmissionGrade:
    """One submission's grade in a child process of its own (harness/grade_child.py), under a time limit."""

    def __init__(self, submission: Submission, adapter, level: int, seed: int, only, stack, folder: Path,
                 timeout: float, say, verbose: bool = False, gate: RunGate | None = None):
        self.submission, self.adapter, self.level, self.seed, self.only = submission, adapter, level, seed, only
        self.stack, self.folder, self.timeout, self.say, self.verbose = stack, folder, timeout, say, verbose
        self.gate = gate  # set when other submissions share the stack at the same time (--jobs N)
        self.results = self.grade_dir = self.error = None
        self.not_started: str | None = None
        self.process = None  # the child process (multiprocessing, forked)
        self._conn = None

    def _progress(self, text: str) -> None:
        if self.verbose or not str(text).startswith("["):
            self.say("    " + str(text))

    def _serve(self, until: float) -> dict | None:
        """Show the child's lines and answer its calls on the stack until its outcome (returned), its end without
        one (an error outcome), or ``until`` (None)."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return None
            try:
                ready = self._conn.poll(min(left, 0.5))
                message = self._conn.recv() if ready else None
            except (EOFError, OSError):
                self.process.join(5)
                return {"ended": "error", "error_type": "ChildProcessError",
                        "error": f"the grade's process ended (exit code {self.process.exitcode}) without an outcome"}
            if message is None:
                if not self.process.is_alive() and not self._conn.poll():
                    return {"ended": "error", "error_type": "ChildProcessError",
                            "error": f"the grade's process ended (exit code {self.process.exitcode}) without an "
                                     "outcome"}
                continue
            kind = message[0]
            if kind == "say":
                self._progress(message[1])
            elif kind == "call":
                self._conn.send(answer(self.stack, *message[1:]))
            elif kind == "done":
                return message[1]

    def run(self) -> str:
        """Grade; returns how it ended: ``done``, ``did not start``, ``timeout`` or ``error``."""
        import multiprocessing

        self.folder.mkdir(parents=True, exist_ok=True)
        context = multiprocessing.get_context("fork")  # the child starts with the stack and the adapter in hand
        self._conn, child_end = context.Pipe()
        self.process = context.Process(target=child_main, args=(self, child_end),
                                       name=f"grade-{self.submission.name}")
        self.process.start()
        child_end.close()
        try:
            outcome = self._serve(time.monotonic() + self.timeout)
        except BaseException:  # Ctrl-C / SIGTERM of the whole run: stop this grade as a timeout would, then go
            self.stop()
            raise
        if outcome is None:
            self.say(f"    time limit of {self.timeout:.0f}s reached: stopping {self.submission.name}")
            self.stop()
            outcome = {"ended": "timeout"}  # whatever the child said as it stopped, the time limit ended it
        self.process.join(10)
        return self._ended(outcome)

    def _ended(self, outcome: dict) -> str:
        ended = outcome.get("ended", "error")
        if ended == "done":
            self.results, self.grade_dir = outcome["results"], Path(outcome["grade_dir"])
        elif ended == "did not start":
            self.not_started = outcome.get("not_started")
            self.error = DidNotStart(self.not_started or "")
        elif ended == "timeout":
            self.error = SubmissionTimeout(f"time limit of {self.timeout:.0f}s reached")
        else:
            ended = "error"
            self.error = GradeFailed(outcome.get("error_type", "Error"), outcome.get("error", ""))
        return ended

    def interrupt(self) -> None:
        """Stop this grade from another thread (the whole run interrupted while it ran beside others). The thread
        running it keeps reading the child's pipe (its calls answered, its outcome taken): this one only signals the
        child and waits for it, killing its tree if it does not exit."""
        if self.process is None or not self.process.is_alive():
            return
        try:
            os.kill(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        self.process.join(GRACEFUL_STOP_SECONDS)
        if self.process.is_alive():
            labels = {pid: f"role {key.split('/', 1)[1]}" for key, pid in roles_running(self.folder).items()}
            kill_tree(self.process.pid, self.say, labels)
            self.process.join(10)

    def stop(self) -> dict | None:
        """Tell the child to stop (SIGTERM: its grade's teardown stops its roles, then it kills by PID whatever is
        left below it); a child that does not exit in time is killed with its whole tree. Returns its outcome."""
        running = roles_running(self.folder)
        if running:
            self.say("    roles running: " + ", ".join(f"{k.split('/', 1)[1]} pid {pid}" for k, pid in running.items()))
        if self.process is None or not self.process.is_alive():
            return None
        try:
            os.kill(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return None
        outcome = self._serve(time.monotonic() + GRACEFUL_STOP_SECONDS)
        self.process.join(5 if outcome is not None else 0.5)  # with its outcome sent, it is exiting
        if self.process.is_alive():
            self.say(f"    the grade of {self.submission.name} did not stop in {GRACEFUL_STOP_SECONDS:.0f}s: "
                     "killing its process and everything below it")
            labels = {pid: f"role {key.split('/', 1)[1]}" for key, pid in roles_running(self.folder).items()}
            kill_tree(self.process.pid, self.say, labels)
            self.process.join(10)
        return outcome


class GradeFailed(Exception):
    """What ended a grade in its process with an error: its type's name and its message, as the row shows them."""

    def __init__(self, type_name: str, message: str):
        super().__init__(message)
        self.type_name = type_name

    def __str__(self) -> str:
        return f"{self.type_name}: {self.args[0]}"


def tidy_stack(stack, say) -> None:
    """What the next submission needs: every service up and no toxic left (as the test fixtures check)."""
    for name in SERVICES:
        try:
            if not stack.alive(name):
                say(f"    {name} was down: restarting it")
                stack.restart(name)
        except Exception as exc:  # the next submission's run will say what is wrong
            say(f"    could not restart {name}: {type(exc).__name__}: {exc}")
    try:
        stack.toxiproxy.reset()
    except Exception as exc:
        say(f"    toxiproxy reset failed: {type(exc).__name__}: {exc}")


# --- the whole class --------------------------------------------------------------------------------------------------

def exit_code(rows: list[table.Row], infrastructure: bool = False) -> int:
    """0 every submission valid, 1 any invalid or tampered, 2 otherwise (unknown, not proven, not graded), 3 when
    the grader's own infrastructure failed (the shared stack did not start, twice): harness/errors.py."""
    from .errors import EXIT_INFRASTRUCTURE, exit_code as verdict_exit, worst_exit

    if infrastructure:
        return EXIT_INFRASTRUCTURE
    if not rows:
        return 2
    return worst_exit(verdict_exit(r.verdict) for r in rows)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(Path(path).relative_to(base))
    except ValueError:
        return str(path)


def write_tables(out: Path, rows: list[table.Row], meta: dict) -> None:
    (out / "table.md").write_text(table.markdown(rows, meta))
    (out / "table.csv").write_text(table.csv_text(rows))
    (out / "index.html").write_text(table.html(rows, meta))
    (out / "results.json").write_text(json.dumps({"kind": "grade-many", **meta, "rows": [r.to_dict() for r in rows]},
                                                 indent=1, default=str))


class ClassGrade:
    """The state of one grade-many run: the shared stack (started at the first submission that needs it), the rows."""

    def __init__(self, out: Path, level: int, seed: int, only: list[str] | None, timeout: float, stack, progress,
                 verbose: bool, jobs: int = 1, profile=None):
        self.out, self.level, self.seed, self.only, self.timeout = out, level, seed, only, timeout
        self.stack, self.own_stack, self.say, self.verbose = stack, stack is None, progress, verbose
        self.stack_error: str | None = None
        self.gate = RunGate() if jobs > 1 else None  # several submissions at once on the one stack
        self.profile = profile  # a course profile (harness/course_profile.py): checked before anything starts
        self.results: dict[str, dict] = {}  # submission name -> its grade's results (for the class table)
        self.active: dict[str, SubmissionGrade] = {}  # grades running now (--jobs N), stopped on an interrupt
        self._stack_lock = threading.Lock()

    def ensure_stack(self):
        with self._stack_lock:
            return self._ensure_stack()

    def _ensure_stack(self):
        if self.stack is None and self.stack_error is None:
            from .errors import InfrastructureError
            from .run_driver import start_stack

            self.say("starting the shared stack (PostgreSQL, RabbitMQ, SeaweedFS, Toxiproxy) ...")
            try:  # an infrastructure failure is retried once by itself, then reported (exit 3): every row says it
                self.stack, _ = start_stack(self.out / "stack", progress=self.say, retry=True,
                                            what="the shared stack")
            except InfrastructureError as exc:
                self.stack_error = str(exc)
                self.say(self.stack_error)
        return self.stack

    def stop_stack(self) -> None:
        if self.gate is not None:
            self.gate.close()
        if self.own_stack and self.stack is not None:
            began = time.monotonic()
            self.stack.stop()
            self.stack = None
            self.say(f"stack stopped in {time.monotonic() - began:.1f}s")

    def one(self, sub: Submission) -> table.Row:
        from .adapter_check import check

        began = time.monotonic()
        only_text = ",".join(self.only) if self.only else ""
        reproduce = (f"harness grade --sut {sub.shown_path} --level {self.level} --seed {self.seed}"
                     + (f" --only {only_text}" if self.only else ""))

        def row(verdict, reason, results=None, report=None) -> table.Row:
            seconds = round(time.monotonic() - began, 1)
            if results is not None:
                self.results[sub.name] = results
                return table.row_from_grade(sub.name, sub.shown_path, results, seconds, report, verdict=verdict,
                                            reason=reason, reproduce=reproduce)
            return table.Row(sub.name, sub.shown_path, verdict, {}, seconds, report, reason, reproduce)

        if sub.problem or sub.adapter is None:
            return row("invalid adapter", sub.problem or "no adapter file")
        try:
            report = check(sub.adapter, self.level)
            if not report.ok:  # the problems `harness adapter check` prints, first three
                shown = "; ".join(str(p) for p in report.problems[:3])
                more = len(report.problems) - 3
                return row("invalid adapter", shown + (f" (+{more} more)" if more > 0 else ""))
            adapter = adapter_mod.load(sub.adapter)
        except Exception as exc:
            return row("invalid adapter", f"{type(exc).__name__}: {exc}")
        if self.profile is not None:  # the course's level, capabilities and timing bounds: refused before it starts
            from .course_profile import refusal

            reasons = refusal(self.profile, adapter)
            if reasons:
                return row("refused", f"refused by the course profile {self.profile.name}: " + "; ".join(reasons))
        if self.ensure_stack() is None:
            return row("error", f"not graded: {self.stack_error}")
        try:
            return self._grade(sub, adapter, row)
        finally:
            with self.gate.exclusive() if self.gate is not None else nullcontext():  # no neighbour's toxic reset
                tidy_stack(self.stack, self.say)

    def _grade(self, sub: Submission, adapter, row) -> table.Row:
        folder = self.out / sub.name
        job = SubmissionGrade(sub, adapter, self.level, self.seed, self.only, self.stack, folder, self.timeout,
                              self.say, self.verbose, gate=self.gate)
        began = time.monotonic()
        self.active[sub.name] = job
        try:
            ended = job.run()
        finally:
            self.active.pop(sub.name, None)
        if ended == "done":
            return row(None, None, job.results, _relative(job.grade_dir / "index.html", self.out))
        if ended == "did not start":
            why = "the submission did not start"
            reason = job.not_started or str(job.error)
        elif ended == "timeout":
            unfinished = sorted(p.parent.name for p in folder.glob("grade-*/*/history.jsonl")
                                if not (p.parent / "results.json").is_file())
            why = f"the submission hit its time limit of {self.timeout:.0f}s"
            reason = f"time limit of {self.timeout:.0f}s reached" + (f" during {', '.join(unfinished)}"
                                                                      if unfinished else "")
        else:
            why = f"the grade failed: {job.error}"
            reason = why
        try:
            partial = partial_grade(folder, adapter, self.level, self.seed, self.only, why, time.monotonic() - began)
        except Exception as exc:
            self.say(f"    could not write the partial grade report: {type(exc).__name__}: {exc}")
            partial = None
        if partial is None:
            return row(ended, reason)
        results, grade_dir = partial
        finished = len(results["scenarios"])
        planned = finished + sum(1 for s in results["skipped"] if s["reason"].startswith("not run: "))
        if ended == "timeout":
            reason += f" ({finished} of {planned} scenarios finished)"
        return row(ended, reason, results, _relative(grade_dir / "index.html", self.out))


def grade_many(arguments: list[str], level: int, seed: int, *, only: list[str] | None = None,
               timeout: float = DEFAULT_TIMEOUT, reports_dir: Path | None = None, stack=None, progress=print,
               verbose: bool = False, jobs: int = 1, shard: tuple[int, int] | None = None,
               profile=None) -> tuple[list[table.Row], Path]:
    """Grade every submission named by ``arguments`` (``jobs`` at a time on the one stack; only the ``shard``
    (i, n) slice of the sorted list when given); returns the rows and the folder holding the tables."""
    from . import class_table

    everyone = sorted(discover(arguments), key=lambda s: s.name)  # the order shards slice and tables list
    index_of = {s.name: k for k, s in enumerate(everyone, start=1)}
    submissions = class_table.shard_of(everyone, *shard) if shard else everyone
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    shard_tag = f"-shard{shard[0]}of{shard[1]}" if shard else ""
    out = Path(reports_dir or REPORTS_DIR) / f"grade-many-{stamp}-L{level}-s{seed}{shard_tag}"
    out.mkdir(parents=True, exist_ok=True)
    only_text = ",".join(only) if only else ""
    jobs = max(1, int(jobs))
    meta = {"title": f"Grades at level {level}", "level": level, "seed": seed, "only": only or None,
            "timeout_seconds": timeout, "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "submissions": len(everyone), "shard": f"{shard[0]}/{shard[1]}" if shard else None,
            "profile": getattr(profile, "name", None),
            "facts": {"level": level, "base seed": seed, "submissions": len(submissions),
                      **({"shard": f"{shard[0]}/{shard[1]} of {len(everyone)}"} if shard else {}),
                      **({"side by side": jobs} if jobs > 1 else {}),
                      "time limit": f"{timeout:.0f}s per submission", **({"only": only_text} if only else {}),
                      "started": datetime.now().strftime("%Y-%m-%d %H:%M")}}
    progress(f"grade-many: {len(submissions)} submission{'s' if len(submissions) != 1 else ''} at level {level}, "
             f"base seed {seed}, time limit {timeout:.0f}s each" + (f", only {only_text}" if only else "")
             + (f", shard {shard[0]}/{shard[1]} of {len(everyone)}" if shard else "")
             + (f", {jobs} at a time" if jobs > 1 else ""))
    progress(f"table: {out}/class.html  {out}/class.csv  {out}/index.html  {out}/table.md")
    run = ClassGrade(out, level, seed, only, timeout, stack, progress, verbose, jobs=jobs, profile=profile)
    rows: list[table.Row] = []
    class_rows: list[dict] = []
    lock = threading.Lock()

    def grade_one(position: int, sub: Submission) -> None:
        progress(f"[{position}/{len(submissions)}] {sub.name}: {sub.shown_path}")
        row = run.one(sub)
        results = run.results.get(sub.name)
        crow = class_table.class_row(index_of[sub.name], row, results, sub.name)
        try:
            class_table.write_feedback(out / sub.name, sub.name, crow, results)
        except Exception as exc:  # a page not written is said, never a crash of the class
            progress(f"    could not write the feedback page: {type(exc).__name__}: {exc}")
        with lock:
            rows.append(row)
            class_rows.append(crow)
            progress(f"[{position}/{len(submissions)}] {sub.name}: {row.verdict.upper()} in {row.seconds or 0:.1f}s"
                     + (f", level {crow['level_achieved']}" if crow["level_achieved"] else "")
                     + (f" — {row.reason}" if row.reason else ""))
            _write_all(out, rows, class_rows, meta, run)  # after every submission: an interrupted run keeps its table

    try:
        if jobs == 1:
            for position, sub in enumerate(submissions, start=1):
                grade_one(position, sub)
        else:
            pool = ThreadPoolExecutor(jobs, thread_name_prefix="submission")
            try:
                for future in [pool.submit(grade_one, k, sub) for k, sub in enumerate(submissions, start=1)]:
                    future.result()
            except BaseException:  # Ctrl-C / SIGTERM: the grades running beside each other are stopped first
                pool.shutdown(wait=False, cancel_futures=True)
                for job in list(run.active.values()):
                    job.interrupt()
                raise
            pool.shutdown(wait=True)
    finally:
        run.stop_stack()
    _write_all(out, rows, class_rows, meta, run)
    return rows, out


def _write_all(out: Path, rows: list[table.Row], class_rows: list[dict], meta: dict, run: "ClassGrade") -> None:
    from . import class_table

    meta["infrastructure_failure"] = run.stack_error if run.stack is None and run.stack_error else None
    by_index = sorted(zip(class_rows, rows), key=lambda pair: pair[0]["index"])
    write_tables(out, [r for _, r in by_index], meta)
    class_table.write(out, class_rows, {k: v for k, v in meta.items() if k not in ("facts", "title")})


def merge_command(folders: list[str], reports: str | None, progress=print) -> int:
    """`harness grade-many merge DIR...`: the shards' folders into one class table (the same CSV and HTML as one
    run), each submission's folder copied beside it so its links hold; exit code as for one run."""
    import shutil

    from . import class_table
    from .errors import exit_code as verdict_exit, worst_exit

    try:
        class_rows, meta = class_table.merge([Path(f) for f in folders])
    except (class_table.MergeError, OSError, ValueError, KeyError) as exc:
        progress(f"harness: cannot merge: {exc}")
        return 2
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    out = Path(reports or REPORTS_DIR) / f"grade-many-{stamp}-L{meta['level']}-s{meta['seed']}-merged"
    out.mkdir(parents=True, exist_ok=True)
    for r in class_rows:
        for key in ("report", "feedback"):
            if r.get(key):  # made absolute by merge(): copy the submission's folder, keep the link relative
                source = Path(r[key])
                name_dir = next((p for p in [source, *source.parents] if p.name == r["name"]), None)
                if name_dir is not None and name_dir.is_dir():
                    if not (out / r["name"]).exists():
                        shutil.copytree(name_dir, out / r["name"], symlinks=True)
                    r[key] = str(source.relative_to(name_dir.parent))
    class_table.write(out, class_rows, meta)
    rows = [table.Row(r["name"], r["adapter"], r["verdict"], {}, r.get("seconds"), r.get("report") or None,
                      r.get("reason", ""), r.get("reproduce")) for r in class_rows]
    for r, crow in zip(rows, class_rows):  # the requirement cells of each submission's own grade, when present
        results_path = out / (crow.get("report") or "-").replace("index.html", "results.json")
        if crow.get("report") and results_path.is_file():
            r.requirements = {rid: q.get("status", "") for rid, q in
                              (json.loads(results_path.read_text()).get("requirements") or {}).items()}
    write_tables(out, rows, {**meta, "title": f"Grades at level {meta['level']} (merged)",
                             "facts": {"level": meta["level"], "base seed": meta["seed"],
                                       "submissions": meta.get("submissions"), "merged from": len(folders)}})
    for r in class_rows:
        progress(f"  {r['name']:24} {r['verdict']:16} level {r.get('level_achieved') or '—'}  {r.get('reason', '')}")
    code = worst_exit(verdict_exit(r["verdict"]) for r in class_rows) if class_rows else 2
    progress(f"GRADE-MANY merged {len(folders)} shard(s): {len(class_rows)} submissions, exit {code}")
    progress(f"table: {out}/class.html  {out}/class.csv")
    return code


def run_command(args, seed: int, progress=print) -> int:
    """`harness grade-many` (argparse namespace from harness/cli.py): grade, print the table's summary, exit code."""
    from . import class_table

    if args.submissions and args.submissions[0] == "merge" and not Path("merge").exists():
        return merge_command(args.submissions[1:], args.reports, progress)
    only = [name.strip() for name in args.only.split(",") if name.strip()] if args.only else None
    profile = None
    if getattr(args, "profile", None):
        from .course_profile import ProfileError, load as load_profile

        try:
            profile = load_profile(args.profile)
        except ProfileError as exc:
            progress(f"harness: {exc}")
            return 2
        only = only or profile.scenarios
    if profile and args.level and args.level != profile.level:
        progress(f"harness: --level {args.level} differs from the course profile's level {profile.level}")
        return 2
    level = args.level or (profile.level if profile else None)
    if level is None:
        progress("harness: grade-many needs --level (or a course profile's level)")
        return 2
    if only:
        known = {s.name for s in catalogue_mod.catalogue()}
        unknown = [name for name in only if name not in known]
        if unknown:
            progress(f"harness: unknown scenario(s) in --only: {', '.join(unknown)} (see `harness scenarios`)")
            return 2
    try:
        shard = class_table.parse_shard(args.shard) if getattr(args, "shard", None) else None
    except ValueError as exc:
        progress(f"harness: {exc}")
        return 2
    timeout = args.timeout_per_submission or (profile.timeout_per_submission if profile else None) or DEFAULT_TIMEOUT
    rows, out = grade_many(args.submissions, level, seed, only=only, timeout=timeout,
                           reports_dir=Path(args.reports) if args.reports else None, progress=progress,
                           verbose=args.verbose, jobs=getattr(args, "jobs", 1) or 1, shard=shard, profile=profile)
    progress("")
    width = max([len(r.name) for r in rows] + [10])
    for r in rows:
        reqs = " ".join(table.STATUS_SYMBOL.get(r.requirements.get(rid, ""), "?") for rid in table.REQUIREMENTS)
        progress(f"  {r.name:{width}} {r.verdict:16} {reqs}  {r.seconds or 0:7.1f}s  {r.reason}")
    infrastructure = json.loads((out / "results.json").read_text()).get("infrastructure_failure")
    code = exit_code(rows, infrastructure=bool(infrastructure))
    progress(f"GRADE-MANY level {level} base seed {seed}: {len(rows)} submissions, exit {code}"
             + (f" (the grader's infrastructure failed: {infrastructure})" if infrastructure else ""))
    progress(f"table: {out}/class.html  {out}/class.csv  {out}/index.html  {out}/table.md")
    return code
