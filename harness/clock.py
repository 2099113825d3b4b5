"""Clock offsets for chosen roles (a scenario's ``clock_skew``), through libfaketime or clockshift.

A scenario names roles only by group (``@window``, ``@recovers_work``, ``@consumers``) and gives each group an
offset, absolute or relative to a declared timing::

    clock_skew = [{ roles = ["@window", "@recovers_work"], offset = { of = "staging_retention_seconds", times = 0.75 } }]

Those roles start with ``LD_PRELOAD=libfaketime`` and ``FAKETIME="+<seconds>"`` (their wall clock runs that far
ahead; ``FAKETIME_DONT_FAKE_MONOTONIC=1`` keeps monotonic clocks real, so timeouts and sleeps are unchanged). Before
libfaketime the harness preloads its own fix (``harness/faketime_fix.c``, built by scripts/bootstrap.sh or here at
first use with the C compiler): libfaketime 0.9.10 turns a monotonic absolute sleep into ``EINVAL`` even with
monotonic clocks real, which breaks Python 3.11+'s ``time.sleep`` in a skewed role; the fix sends monotonic sleeps
to the kernel untouched. Without the fix the offset is not applied (``unavailable``): a skew that breaks a correct
program would be the harness's fault, not the program's. A role whose program libfaketime cannot reach — a Go
binary (its runtime reads the clock through the vDSO, never libc) or a static one — starts instead under
``clockshift`` (``harness/clockshift.c``, built the same way): ptrace and seccomp hand its wall-clock system calls
to a tracer that answers them moved, after hiding the vDSO from the program at its exec, so every runtime sees the
offset. The offset is only as good as its reach, so after start each skewed role is verified and the result
recorded (``observe`` line, ``source = "clock_skew"``):

* ``verified``  — the role answers HTTP (the API's health path, or its /metrics when the adapter lists the role
  under ``[metrics]``) and its ``Date`` header is off by the offset (±1.5 s: the header has whole seconds and
  servers refresh it about once a second): the role's own clock as it reports it;
* ``preloaded`` — libfaketime is mapped into a process of the role's group and the program is not a Go binary;
  libc time calls are faked, but no clock of the role was seen (not a proof: ``clock_agreement`` then looks for
  event times the role stamped, see there);
* ``traced``    — the role's program runs under ``clockshift`` (a Go or static binary) and no clock of the role
  was seen (not a proof either, like ``preloaded``);
* ``ineffective`` — the HTTP ``Date`` shows no offset;
* ``cannot_apply`` — a Go program (it reads the clock through the vDSO, never through libc) or a static binary
  where the library is not mapped and clockshift was not used (a wrapper script hid the program);
* ``unavailable`` — libfaketime is not installed (Debian: ``apt-get install faketime``), or its fix could not
  be built;
* ``not_running`` — the role was not running when verified (e.g. held).

Checkers that rely on an offset (``staging_safety`` in a run with ``clock_skew``) say ``unknown`` unless every
skewed role is ``verified``, ``preloaded`` or ``traced``; ``clock_agreement`` wants the role's own
clock (``verified``, or event times the role stamped).

An entry may also set ``tz`` (an IANA zone): those roles start with ``TZ=<zone>``, recorded per instance as an
``observe`` line with ``source = "clock_tz"`` (it reaches every program; it changes how a time is written, not
what a clock reads).
"""

from __future__ import annotations

import email.utils
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .nemesis import scale

LIBRARY_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
IN_EFFECT = frozenset({"verified", "preloaded", "traced"})
DATE_TOLERANCE_SECONDS = 1.5


def library() -> str | None:
    """libfaketime's path: HARNESS_LIBFAKETIME, else the usual Debian / local locations."""
    for candidate in (os.environ.get("HARNESS_LIBFAKETIME"), *LIBRARY_CANDIDATES):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def resolve(entries: list[dict], adapter, windows: list[str], timings: dict) -> dict[str, float]:
    """role name -> offset in seconds (a later entry naming the same role wins; an entry with only a ``tz`` sets
    no offset)."""
    out: dict[str, float] = {}
    for entry in entries or []:
        if entry.get("offset") is None:
            continue
        groups = entry.get("roles")
        groups = [groups] if isinstance(groups, str) else list(groups or [])
        offset = float(scale(entry.get("offset", 0), timings))
        for role in adapter.expand_roles(groups, windows):
            if role in adapter.roles:
                out[role] = offset
    return out


def groups_of(entries: list[dict], adapter, windows: list[str]) -> dict[str, list[str]]:
    """role name -> the scenario's role groups (``@producers``, ``@consumers``, …) that named it in ``clock_skew``:
    recorded with each clock observation so a checker knows which side of the queue a clock belongs to."""
    out: dict[str, list[str]] = {}
    for entry in entries or []:
        groups = entry.get("roles")
        groups = [groups] if isinstance(groups, str) else list(groups or [])
        for group in groups:
            for role in adapter.expand_roles([group], windows):
                if role in adapter.roles and group not in out.setdefault(role, []):
                    out[role].append(group)
    return out


def resolve_tz(entries: list[dict], adapter, windows: list[str]) -> dict[str, str]:
    """role name -> TZ (an IANA zone) for the entries that set ``tz`` (a later entry naming the same role wins). A
    time zone reaches any program through its environment, Go included: libc and Go's time package both read TZ."""
    out: dict[str, str] = {}
    for entry in entries or []:
        if not entry.get("tz"):
            continue
        groups = entry.get("roles")
        groups = [groups] if isinstance(groups, str) else list(groups or [])
        for role in adapter.expand_roles(groups, windows):
            if role in adapter.roles:
                out[role] = str(entry["tz"])
    return out


FIX_SOURCE = Path(__file__).with_name("faketime_fix.c")


def fix_library(build: bool = True) -> str | None:
    """The harness's fix preloaded before libfaketime (``harness/faketime_fix.c``: monotonic sleeps go to the kernel
    untouched): HARNESS_FAKETIME_FIX, else built into ``.tools/lib/`` (see ``_built``)."""
    return _built(FIX_SOURCE, "faketime_fix.so", ["-shared", "-fPIC", "-O2"], "HARNESS_FAKETIME_FIX", build,
                  ("-ldl",))


CLOCKSHIFT_SOURCE = Path(__file__).with_name("clockshift.c")


def _built(source: Path, name: str, flags: list[str], env_var: str, build: bool, libs: tuple = ()) -> str | None:
    """A program or library the harness builds from its own C source: ``env_var`` if set, else ``.tools/lib/`` of
    the checkout (a temporary folder when that is not writable), built there with ``cc`` when missing (named after
    the source's hash, so an edited source is built again)."""
    given = os.environ.get(env_var)
    if given:
        return given if Path(given).is_file() else None
    if not source.is_file():
        return None
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    folders = [Path(__file__).resolve().parents[1] / ".tools" / "lib", Path(tempfile.gettempdir()) / "harness-lib"]
    suffix = Path(name).suffix
    target = f"{Path(name).stem}-{digest}{suffix}"
    for folder in folders:
        if (folder / target).is_file():
            return str(folder / target)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not build or compiler is None:
        return None
    for folder in folders:
        built = folder / target
        try:
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f".{Path(name).stem}-{digest}.{os.getpid()}{suffix}"
            subprocess.run([compiler, *flags, "-o", str(partial), str(source), *libs], check=True, capture_output=True,
                           timeout=120)
            partial.chmod(0o755)
            os.replace(partial, built)  # atomic: runs building it at once each see a whole file
            return str(built)
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def clockshift(build: bool = True) -> str | None:
    """``harness/clockshift.c`` built: ``clockshift OFFSET -- PROGRAM ARGS`` runs a program whose clock libfaketime
    cannot reach (Go, static binaries) with its wall clock moved, through ptrace and seccomp (HARNESS_CLOCKSHIFT to
    give one). x86_64 only: elsewhere None (a Go role's clock-skew scenario is then skipped with the reason)."""
    if platform.machine() not in ("x86_64", "AMD64") and not os.environ.get("HARNESS_CLOCKSHIFT"):
        return None
    return _built(CLOCKSHIFT_SOURCE, "clockshift", ["-O2"], "HARNESS_CLOCKSHIFT", build)


def is_static_file(path: str) -> bool:
    """An ELF executable with no program interpreter (PT_INTERP): libc, if any, is linked in, and LD_PRELOAD is never
    read."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or not head.startswith(b"\x7fELF") or head[4] != 2:  # ELF64 only
                return False
            order = "little" if head[5] == 1 else "big"
            phoff, phentsize, phnum = (int.from_bytes(head[32:40], order), int.from_bytes(head[54:56], order),
                                       int.from_bytes(head[56:58], order))
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    return not any(int.from_bytes(table[i:i + 4], order) == 3 for i in range(0, len(table), phentsize))  # PT_INTERP


def needs_clockshift(program: str) -> bool:
    """libfaketime cannot move this program's clock: a Go binary (the vDSO, never libc) or a static one."""
    return os.path.isfile(program) and (is_go_file(program) or is_static_file(program))


def skew_command(command: list[str], offset: float) -> list[str] | None:
    """The command of a role whose program libfaketime cannot reach, run under clockshift (None: libfaketime does,
    or clockshift could not be built)."""
    if not command or not needs_clockshift(command[0]):
        return None
    shifter = clockshift()
    return [shifter, f"{offset:.3f}", "--", *command] if shifter else None


def libraries() -> tuple[str | None, str | None, str | None]:
    """(libfaketime, the harness's fix, why the offset cannot be applied — None when both are there)."""
    lib = library()
    if lib is None:
        return None, None, "libfaketime not found (Debian: apt-get install faketime; or set HARNESS_LIBFAKETIME)"
    fix = fix_library()
    if fix is None:
        return lib, None, ("the harness's libfaketime fix (harness/faketime_fix.c) could not be built (no C compiler; "
                           "scripts/bootstrap.sh builds it, or set HARNESS_FAKETIME_FIX): without it libfaketime "
                           "breaks monotonic sleeps (Python's time.sleep), so no offset is applied")
    return lib, fix, None


def faketime_env(offset: float, lib: str, base_env: dict, fix: str | None = None) -> dict[str, str]:
    """The environment of a skewed role: the fix first (its clock_nanosleep wins over libfaketime's), libfaketime,
    then whatever the role preloads itself."""
    preload = " ".join(p for p in (fix, lib, base_env.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload, "FAKETIME": f"{'+' if offset >= 0 else '-'}{abs(offset):.3f}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


GO_NOTE = re.compile(rb"\x04\x00\x00\x00.{4}\x04\x00\x00\x00Go\x00\x00", re.S)  # ELF note "Go", type 4 (build id)
GO_BUILDINFO = b"\xff Go buildinf:"  # the magic of the .go.buildinfo section (every Go binary since 1.13)


def is_go_binary(pid: int) -> bool:
    """The program of ``pid`` is a Go binary: its build-id note near the start, else the buildinfo magic anywhere."""
    return is_go_file(f"/proc/{pid}/exe")


def cannot_skew(adapter, scenario_raw: dict) -> str | None:
    """Why a scenario's clock offsets cannot reach the adapter's roles, known before any start (a role whose program
    is a Go binary: Go reads the clock without libc), else None. A wrapper script hides this: then the run's
    verification says so and the checks relying on the offset are unknown. A scenario that also sets a ``tz`` runs
    anyway: the time zones reach every program, and its checks say the offset part was not exercised."""
    if any(entry.get("tz") for entry in scenario_raw.get("clock_skew") or []):
        return None
    groups = [g for entry in scenario_raw.get("clock_skew") or []
              for g in ([entry.get("roles")] if isinstance(entry.get("roles"), str) else entry.get("roles") or [])]
    go = []
    for role in adapter.expand_roles(groups, scenario_raw.get("windows") or []):
        if role not in adapter.roles:
            continue
        try:
            program = adapter.resolve_command(adapter.roles[role].command)[0]
        except Exception:
            continue
        if needs_clockshift(program):
            go.append(role)
    if go and clockshift() is None:
        return (f"its clock offsets cannot reach {', '.join(go)}: a Go or static program reads the clock without "
                "libc, so libfaketime cannot move it, and harness/clockshift.c could not be built (no C compiler)")
    return None


def is_go_file(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(64 * 1024)
            if not head.startswith(b"\x7fELF"):
                return False
            if GO_NOTE.search(head) or GO_BUILDINFO in head:
                return True
            tail = head[-16:]
            for _ in range(4096):  # at most 256 MiB, 64 KiB at a time
                chunk = f.read(64 * 1024)
                if not chunk:
                    return False
                if GO_BUILDINFO in tail + chunk:
                    return True
                tail = chunk[-16:]
    except OSError:
        return False
    return False


def maps_library(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            return "libfaketime" in f.read()
    except OSError:
        return False


def traced_by_clockshift(pid: int) -> bool:
    """``pid`` is traced by a clockshift process (harness/clockshift.c)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            tracer = next((int(line.split()[1]) for line in f if line.startswith("TracerPid:")), 0)
        if not tracer:
            return False
        with open(f"/proc/{tracer}/cmdline", "rb") as f:
            return b"clockshift" in f.read().split(b"\0", 1)[0]
    except (OSError, ValueError):
        return False


def date_offset(client, url: str) -> float | None:
    """The server's Date header minus the harness's clock at the answer (seconds), or None."""
    try:
        response = client.get(url, timeout=3)
    except Exception:
        return None
    received = time.time()
    header = response.headers.get("date")
    if not header:
        return None
    try:
        return email.utils.parsedate_to_datetime(header).timestamp() - received
    except (TypeError, ValueError):
        return None


def verify(instance, offset: float, group_members, http_url: str | None = None, client=None,
           wait_seconds: float = 0.0) -> dict:
    """What can be shown of the offset of one running instance (see the module docstring). ``http_url``: an HTTP
    endpoint the instance serves (the API's health path, or the /metrics of a role the adapter lists under
    [metrics]); its ``Date`` header is the role's own clock as it reports it. ``wait_seconds``: how long to wait for
    a first answer (a role's /metrics may come up after the API is healthy)."""
    if not instance.alive():
        return {"status": "not_running", "reason": "not running when the offset was verified"}
    pids = group_members(instance.pid) or [instance.pid]
    go = any(is_go_binary(pid) for pid in pids)
    mapped = any(maps_library(pid) for pid in pids)
    traced = any(traced_by_clockshift(pid) for pid in pids)
    facts = {"pids": pids[:8], "go_binary": go, "libfaketime_mapped": mapped, "clockshift_traced": traced}
    if http_url is not None and client is not None:
        measured, tries, until = None, 0, time.monotonic() + wait_seconds
        while True:  # the Date header is refreshed about once a second: take the closest of a few
            value = date_offset(client, http_url)
            tries += 1
            if value is not None and (measured is None or abs(value - offset) < abs(measured - offset)):
                measured = value
            if measured is not None and abs(measured - offset) <= DATE_TOLERANCE_SECONDS:
                break
            if tries >= 3 and (measured is not None or time.monotonic() >= until or not instance.alive()):
                break
            time.sleep(0.4)
        facts["date_header_offset"] = None if measured is None else round(measured, 3)
        facts["date_header_url"] = http_url
        if measured is not None and abs(offset) > DATE_TOLERANCE_SECONDS:
            if abs(measured - offset) <= DATE_TOLERANCE_SECONDS:
                return {"status": "verified", "reason": "HTTP Date header shows the offset", **facts}
            return {"status": "ineffective", "reason": f"HTTP Date header shows no offset ({measured:+.1f}s, "
                    f"asked {offset:+g}s)" + (": a Go program reads the clock without libc" if go else ""), **facts}
    if traced:
        return {"status": "traced", "reason": "clockshift traces the role's processes (their wall-clock calls are "
                "answered moved; no clock of the role to compare with)", **facts}
    if go:
        return {"status": "cannot_apply", "reason": "a Go program reads the clock through the vDSO, not libc: "
                "libfaketime cannot move it", **facts}
    if mapped:
        return {"status": "preloaded", "reason": "libfaketime is mapped into the role's processes "
                "(libc time calls are faked; no clock of the role to compare with)", **facts}
    return {"status": "cannot_apply", "reason": "libfaketime is not mapped into the role's processes "
            "(a static binary, or LD_PRELOAD dropped)", **facts}


def unverified(history) -> list[dict]:
    """The clock_skew observations of a run whose offset is not shown to be in effect (the latest per instance: a
    role held at start is verified again when it is released)."""
    latest = {e.get("role"): e for e in history.of_type("observe") if e.get("source") == "clock_skew"}
    return [e for e in latest.values() if e.get("status") not in IN_EFFECT]


# --- a run's roles (harness/runner.py): their skewed environment, and the check that the offset took ---------------

def run_role_env(run, role: str) -> dict:
    """A role's environment for the run's clock: LD_PRELOAD=libfaketime + FAKETIME (and TZ) for a role the
    scenario's clock_skew names (a Go or static program gets clockshift around its command instead: the runner)."""
    zone = {"TZ": run.zones[role]} if role in run.zones else {}
    if role not in run.skew:
        return zone
    lib, fix, _why = libraries()
    if lib is None or fix is None:  # recorded as `unavailable` by verify_run
        return zone
    return {**faketime_env(run.skew[role], lib, {**run.env, **run.adapter.roles[role].env}, fix), **zone}


def verify_run(run, only: list[str] | None = None) -> None:
    """Record, per skewed instance of the run, whether its clock offset is shown to be in effect, and the TZ each
    zoned instance started with."""
    for name, instance in run.supervisor.instances.items():
        if instance.role in run.zones and only is None:
            run.history.append("observe", source="clock_tz", role=name, tz=run.zones[instance.role],
                               groups=run.clock_groups.get(instance.role, []), status="set",
                               reason="TZ set in the role's environment at start")
    if not run.skew:
        return
    from . import http_clients
    from .supervisor import group_members

    lib, fix, why = libraries()
    with http_clients.client(base_url=run.base_url) as client:
        for name, instance in run.supervisor.instances.items():
            if instance.role not in run.skew or (only is not None and name not in only):
                continue
            offset = run.skew[instance.role]
            if lib is None or fix is None:
                found = {"status": "unavailable", "reason": why}
            else:
                api = instance.role == run.adapter.http["role"]
                # The role's own clock as it reports it: the Date header of the API, else of the role's /metrics.
                http = run.adapter.http.get("health_path", "/healthz") if api else run.metrics_urls.get(name)
                found = verify(instance, offset, group_members, http, client if http else None,
                               wait_seconds=0.0 if api else 10.0)
            run.history.append("observe", source="clock_skew", role=name, offset_seconds=offset,
                               groups=run.clock_groups.get(instance.role, []), **found)
            run.log(f"clock of {name} +{offset:g}s: {found['status']} ({found['reason']})")
