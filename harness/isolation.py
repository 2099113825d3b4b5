"""Isolation of an untrusted submission's roles from the grader (docs/guides/grade-untrusted.md).

One ``Sandbox`` per scenario run (the supervisor makes it when isolation is on). It takes a free *slot* — a lock
file in ``/run/harness-isolation`` held for the run — and with it:

- an unprivileged user of its own (``harness-sub-N``, uid ``UID_BASE + N``, created on demand): the roles cannot
  signal the harness, the services or another submission, and cannot write the grader's files;
- a cgroup per hierarchy (v1: memory, pids, cpu, freezer; or the unified v2 tree) with memory, process-count and
  CPU limits; cleanup freezes the cgroup, kills every process in it and thaws it, so a role that started its own
  session or daemonized is gone at the end;
- nftables rules in the host namespace for that uid: loopback TCP to the ports named in its own environment (the
  tenant's proxies, its own listeners) and replies on connections others opened to it; everything else (the
  Toxiproxy API, the management API, the services' direct ports, other tenants, the harness) is refused;
- a private mount namespace per role: ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are the run's own size-limited tmpfs,
  home folders the user cannot traverse are replaced by an empty tmpfs (with only the paths the command needs bound
  back), the report folder is hidden; a file-size limit (RLIMIT_FSIZE) on every process;
- a scrubbed environment: only what the runner passes that is not the harness's own environment (the contract's
  variables, the adapter's [env]) plus PATH and the locale;
- a watchdog process holding the slot: when the harness dies (its pipe closes) it kills the cgroup and removes the
  rules and mounts; a slot left behind anyway is reaped by the next run that takes it.

Root is needed (to create users, cgroups, rules and mounts); ``check()`` says what is missing, and the harness
refuses to run unisolated when isolation was asked for.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(os.environ.get("HARNESS_ISOLATION_ROOT", "/run/harness-isolation"))
UID_BASE = int(os.environ.get("HARNESS_ISOLATION_UID_BASE", "64000"))
SLOTS = 64
CGROUP_FS = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
GROUP_NAME = "harness-isolation"
# Environment variables of the harness's own a role keeps (besides what the runner added or changed).
KEEP_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR")
DROP_ENV = ("VIRTUAL_ENV", "HARNESS_ISOLATION", "PYTHONSTARTUP")
HIDDEN_TMP = ("/tmp", "/var/tmp", "/dev/shm")


class IsolationError(RuntimeError):
    """Isolation was asked for but cannot be set up: an infrastructure failure, never a reason to run unisolated."""


# --- the switch -------------------------------------------------------------------------------------------------
_mode = {"value": None}


def set_mode(on: bool | None) -> None:
    """Turn isolation on or off for every run this process starts (the CLI's --isolate / --no-isolation); None
    goes back to the default (the HARNESS_ISOLATION variable, else off)."""
    _mode["value"] = None if on is None else bool(on)


def enabled() -> bool:
    if _mode["value"] is not None:
        return _mode["value"]
    return os.environ.get("HARNESS_ISOLATION", "").lower() in ("1", "on", "true", "yes")


def _env_number(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


@dataclass
class Limits:
    """Per run; each from a HARNESS_ISOLATION_* variable of the harness's environment when set (read at creation)."""

    memory_bytes: int = field(default_factory=lambda: int(_env_number("HARNESS_ISOLATION_MEMORY_MB", 3072)) << 20)
    pids: int = field(default_factory=lambda: int(_env_number("HARNESS_ISOLATION_PIDS", 1024)))
    cpus: float = field(default_factory=lambda: _env_number("HARNESS_ISOLATION_CPUS", os.cpu_count() or 2))
    # The CPU weight of the whole cgroup, in busy tasks' worth: the scheduler weighs a cgroup as ONE task against the
    # harness's and the services' own processes, so at the default weight of one task a submission's roles would get
    # a sliver of a loaded machine (a role not healthy in 30 s). Eight tasks' worth keeps them near their share
    # outside a cgroup; the quota above still caps them.
    cpu_weight_tasks: int = field(default_factory=lambda: int(_env_number("HARNESS_ISOLATION_CPU_WEIGHT", 8)))
    file_size_bytes: int = field(default_factory=lambda: int(_env_number("HARNESS_ISOLATION_FILE_MB", 256)) << 20)
    tmp_bytes: int = field(default_factory=lambda: int(_env_number("HARNESS_ISOLATION_TMP_MB", 512)) << 20)
    wall_seconds: float = field(default_factory=lambda: _env_number("HARNESS_ISOLATION_WALL_SECONDS", 7200))


# --- what the machine offers --------------------------------------------------------------------------------------
def cgroup_version() -> int | None:
    """2 for a pure unified hierarchy, 1 when the v1 controllers this needs are mounted, else None."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return 2
    if all((CGROUP_FS / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
        return 1
    return None


def check() -> list[str]:
    """What stops isolation on this machine (empty: it can be set up)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the harness must run as root to isolate submissions (users, cgroups, nftables, mounts)")
    if cgroup_version() is None:
        problems.append(f"no usable cgroups: need cgroup v2 at {CGROUP_FS} or v1 hierarchies "
                        f"{', '.join(V1_CONTROLLERS)} mounted read-write")
    for tool in ("nft", "unshare", "setpriv", "prlimit", "mount", "useradd"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not installed (Debian: "
                            f"{'nftables' if tool == 'nft' else 'passwd' if tool == 'useradd' else 'util-linux'})")
    return problems


def require() -> None:
    problems = check()
    if problems:
        raise IsolationError("isolation of submissions was asked for but cannot be set up: " + "; ".join(problems)
                             + " (pass --no-isolation to grade trusted code without it)")


def _run(argv: list[str], input_text: str | None = None, check_rc: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, input=input_text, capture_output=True, text=True)
    if check_rc and done.returncode != 0:
        raise IsolationError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


# --- users ----------------------------------------------------------------------------------------------------------
_user_lock = threading.Lock()


def ensure_user(slot: int) -> tuple[str, int, int]:
    """The system user of slot ``slot`` (created on first use): name, uid, gid."""
    import grp
    import pwd

    name, uid = f"harness-sub-{slot}", UID_BASE + slot
    with _user_lock:
        try:
            entry = pwd.getpwnam(name)
            return name, entry.pw_uid, entry.pw_gid
        except KeyError:
            pass
        gid = None
        for attempt in range(5):
            try:
                gid = grp.getgrnam(name).gr_gid
                break
            except KeyError:
                _run(["groupadd", "--system", "--gid", str(uid), name], check_rc=False)
                time.sleep(0.1 * attempt)
        if gid is None:
            raise IsolationError(f"could not create the group {name}")
        for attempt in range(5):  # another harness may hold /etc/passwd's lock for a moment
            done = _run(["useradd", "--system", "--uid", str(uid), "--gid", str(gid), "--no-create-home",
                         "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name], check_rc=False)
            try:
                entry = pwd.getpwnam(name)
                return name, entry.pw_uid, entry.pw_gid
            except KeyError:
                time.sleep(0.2 * (attempt + 1))
        raise IsolationError(f"could not create the user {name}: {done.stderr.strip()}")


# --- cgroups --------------------------------------------------------------------------------------------------------
def _own_cgroup(controller: str) -> str:
    """This process's cgroup path in the v1 hierarchy of ``controller`` (the sandbox nests under it)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return path
    except OSError:
        pass
    return "/"


def cgroup_dirs(slot: int) -> list[Path]:
    """The slot's cgroups: beside the harness's own (never under a common parent: the CPU scheduler weighs a parent
    as one entity, so every slot under one parent would share one task's worth of CPU between them)."""
    name = f"{GROUP_NAME}-slot-{slot}"
    if cgroup_version() == 2:
        return [CGROUP_FS / name]
    return [CGROUP_FS / c / _own_cgroup(c).lstrip("/") / name for c in V1_CONTROLLERS]


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def make_cgroups(slot: int, limits: Limits) -> list[Path]:
    dirs = cgroup_dirs(slot)
    try:
        if cgroup_version() == 2:
            available = (CGROUP_FS / "cgroup.controllers").read_text().split()
            wanted = [c for c in ("memory", "pids", "cpu") if c in available]
            _write(CGROUP_FS / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
            d = dirs[0]
            d.mkdir(exist_ok=True)
            _write(d / "memory.max", str(limits.memory_bytes))
            _write(d / "pids.max", str(limits.pids))
            _write(d / "cpu.max", f"{int(limits.cpus * 100000)} 100000")
            if (d / "cpu.weight").exists():
                _write(d / "cpu.weight", str(min(10000, 100 * limits.cpu_weight_tasks)))
        else:
            for d in dirs:
                d.mkdir(parents=True, exist_ok=True)
            memory, pids, cpu, _freezer = dirs
            _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            _write(pids / "pids.max", str(limits.pids))
            _write(cpu / "cpu.cfs_period_us", "100000")
            _write(cpu / "cpu.cfs_quota_us", str(int(limits.cpus * 100000)))
            _write(cpu / "cpu.shares", str(min(262144, 1024 * limits.cpu_weight_tasks)))
    except OSError as exc:
        raise IsolationError(f"cgroup setup for slot {slot} failed: {exc}") from exc
    return dirs


def cgroup_pids(slot: int) -> list[int]:
    pids: set[int] = set()
    for d in cgroup_dirs(slot):
        try:
            pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            continue
    return sorted(pids)


def kill_cgroup(slot: int, timeout: float = 10.0) -> list[int]:
    """Freeze the slot's cgroup, SIGKILL every process in it, thaw it, wait until it is empty. Returns the pids."""
    dirs = cgroup_dirs(slot)
    v2 = cgroup_version() == 2
    freezer = dirs[0] / "cgroup.freeze" if v2 else dirs[3] / "freezer.state"
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        members = cgroup_pids(slot)
        if not members:
            break
        try:
            _write(freezer, "1" if v2 else "FROZEN")  # nothing forks or exits while we kill
        except OSError:
            pass
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        try:
            _write(freezer, "0" if v2 else "THAWED")  # killed processes die only when thawed
        except OSError:
            pass
        time.sleep(0.05)
    return sorted(killed)


def remove_cgroups(slot: int) -> None:
    for d in cgroup_dirs(slot):
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)


# --- network --------------------------------------------------------------------------------------------------------
def nft_table(slot: int) -> str:
    return f"harness_iso_{slot}"


def make_rules(slot: int, uid: int) -> None:
    table = nft_table(slot)
    _run(["nft", "-f", "-"], input_text=f"""
table inet {table} {{
  set ports {{ type inet_service; }}
  set probed_ports {{ type inet_service; size 256; flags dynamic; }}
  counter probed {{ }}
  counter refused {{ }}
  chain output {{
    type filter hook output priority 0; policy accept;
    meta skuid {uid} ct state established,related accept
    meta skuid {uid} oifname "lo" meta l4proto tcp tcp dport @ports accept
    meta skuid {uid} oifname "lo" meta l4proto tcp add @probed_ports {{ tcp dport }} counter name "probed" reject
    meta skuid {uid} counter name "refused" reject
  }}
}}
""")


def allow_ports(slot: int, ports: set[int]) -> None:
    if ports:
        _run(["nft", "add", "element", "inet", nft_table(slot), "ports",
              "{ " + ", ".join(str(p) for p in sorted(ports)) + " }"])


def refused_packets(slot: int, counter: str = "refused") -> int | None:
    """Packets of the slot's user the rules refused: ``probed`` — loopback TCP to a port its environment does not
    name (the grader's control plane, other tenants' services: an attempt on the grader); ``refused`` — anything
    else (off-machine traffic, UDP)."""
    done = _run(["nft", "-j", "list", "counter", "inet", nft_table(slot), counter], check_rc=False)
    try:
        for item in json.loads(done.stdout)["nftables"]:
            if "counter" in item:
                return int(item["counter"]["packets"])
    except (ValueError, KeyError, TypeError):
        pass
    return None


def probed_ports(slot: int) -> list[int]:
    """The loopback TCP ports the slot's user tried and was refused (at most 256 distinct)."""
    done = _run(["nft", "-j", "list", "set", "inet", nft_table(slot), "probed_ports"], check_rc=False)
    try:
        for item in json.loads(done.stdout)["nftables"]:
            if "set" in item:
                return sorted(int(e) for e in item["set"].get("elem", []) if isinstance(e, int))
    except (ValueError, KeyError, TypeError):
        pass
    return []


def remove_rules(slot: int) -> None:
    _run(["nft", "delete", "table", "inet", nft_table(slot)], check_rc=False)


_PORT_IN_URL = re.compile(r"^[a-z][a-z0-9+.-]*://(?:[^@/]*@)?(?:127\.\d+\.\d+\.\d+|localhost|\[::1\]):(\d+)", re.I)


def ports_in_env(env: dict[str, str]) -> set[int]:
    """Loopback ports the environment hands a role: every URL's port (the tenant's proxies) and every *_PORT."""
    ports = set()
    for key, value in env.items():
        for item in re.split(r"[,; ]+", value or ""):
            match = _PORT_IN_URL.match(item.strip())
            if match:
                ports.add(int(match.group(1)))
        if key.endswith("PORT") and (value or "").isdigit():
            ports.add(int(value))
    return {p for p in ports if 0 < p < 65536}


# --- mounts ---------------------------------------------------------------------------------------------------------
def slot_dir(slot: int) -> Path:
    return ROOT / f"slot-{slot}"


def _mounted(path: Path) -> bool:
    target = str(path)
    try:
        return any(line.split()[4] == target for line in Path("/proc/self/mountinfo").read_text().splitlines())
    except OSError:
        return False


def make_tmp(slot: int, uid: int, gid: int, size: int) -> Path:
    tmp = slot_dir(slot) / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    os.chmod(slot_dir(slot), 0o755)
    if not _mounted(tmp):
        _run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700,uid={uid},gid={gid},nosuid,nodev",
              f"harness-sub-{slot}", str(tmp)])
    return tmp


def remove_tmp(slot: int) -> None:
    tmp = slot_dir(slot) / "tmp"
    for _ in range(3):
        if not _mounted(tmp):
            break
        _run(["umount", "--lazy", str(tmp)], check_rc=False)
    shutil.rmtree(slot_dir(slot), ignore_errors=True)


def _traversable(path: Path) -> bool:
    try:
        return bool(os.stat(path).st_mode & 0o001)
    except OSError:
        return True  # not there: nothing to hide or bind


def blocked_ancestor(path: Path) -> Path | None:
    """The topmost folder above ``path`` that other users cannot traverse (a home folder like /root)."""
    parts = Path(path).parts
    for i in range(2, len(parts) + 1):
        candidate = Path(*parts[:i])
        if candidate != Path(path) and not _traversable(candidate):
            return candidate
    return None


def _under(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def needed_paths(argv: list[str], env: dict[str, str]) -> list[Path]:
    """Folders a role needs to see: the interpreter's and venv's prefixes, the working folder and every existing
    absolute path in its command line and in its environment (PATH-like values split)."""
    found = [Path(os.getcwd()), Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent]
    for item in [*argv, *env.values()]:
        for token in re.split(r"[:=\s]", item or ""):
            if token.startswith("/") and len(token) > 1:
                found.append(Path(token))
    result = []
    for path in found:
        try:
            resolved = [Path(os.path.abspath(path)), Path(os.path.realpath(path))]
        except (OSError, ValueError):
            continue
        for p in resolved:
            if p.is_file():
                p = p.parent
            # The shared temporary folders themselves are replaced, never bound back (TMPDIR and HOME are /tmp).
            if p.is_dir() and p != Path("/") and str(p) not in HIDDEN_TMP:
                result.append(p)
    return sorted(set(result))


def mount_script(slot: int, argv: list[str], env: dict[str, str], hide: list[Path]) -> str:
    """The shell script run as root in the role's new mount namespace, before privileges are dropped."""
    tmp = slot_dir(slot) / "tmp"
    stage = slot_dir(slot) / "stage"
    needed = needed_paths(argv, env)
    overmounts: dict[Path, str] = {}  # target -> "tmp" | "empty"
    for path in needed:
        top = blocked_ancestor(path)
        if top is not None:
            overmounts.setdefault(top, "empty")
    for target in HIDDEN_TMP:
        if Path(target).is_dir():
            overmounts[Path(target)] = "tmp"
    # Paths under an overmount target are bound aside first and back after (a submission under /tmp, a checkout
    # under a home folder); outermost first, nested ones dropped.
    staged: list[Path] = []
    for path in needed:
        if any(_under(path, t) for t in overmounts) and not any(_under(path, s) for s in staged):
            staged = [s for s in staged if not _under(s, path)] + [path]
    lines = ["set -e"]
    for i, path in enumerate(staged):
        (stage / str(i)).mkdir(parents=True, exist_ok=True)
        lines.append(f"mount --rbind {shlex.quote(str(path))} {shlex.quote(str(stage / str(i)))}")
    for target in sorted(overmounts, key=lambda p: len(p.parts)):
        if overmounts[target] == "tmp":
            lines.append(f"mount --bind {shlex.quote(str(tmp))} {shlex.quote(str(target))}")
        else:
            lines.append(f"mount -t tmpfs -o size=1m,mode=0755,nosuid,nodev harness-empty {shlex.quote(str(target))}")
    for i, path in enumerate(staged):
        lines.append(f"mkdir -p {shlex.quote(str(path))}")
        lines.append(f"mount --rbind {shlex.quote(str(stage / str(i)))} {shlex.quote(str(path))}")
    hidden: list[Path] = []
    for path in sorted({Path(os.path.abspath(p)) for p in hide}, key=lambda p: len(p.parts)):
        # The report folder: an empty read-only folder in its place, unless already out of view (under a folder
        # hidden before it, or under a replaced one) or holding what the command needs.
        out_of_view = (any(_under(path, t) for t in overmounts) and not any(_under(path, s) for s in staged)
                       or any(_under(path, h) for h in hidden))
        if path.is_dir() and not out_of_view and not any(_under(n, path) for n in needed):
            lines.append(f"mount -t tmpfs -o ro,size=4k,mode=0755 harness-hidden {shlex.quote(str(path))}")
            hidden.append(path)
    lines.append('exec "$@"')
    return "\n".join(lines)


# --- slots ----------------------------------------------------------------------------------------------------------
def _lock_path(slot: int) -> Path:
    return ROOT / f"slot-{slot}.lock"


def clean_slot(slot: int) -> dict:
    """Remove whatever a run of ``slot`` left (cgroup processes, rules, mounts); the caller holds the slot."""
    killed = kill_cgroup(slot)
    remove_cgroups(slot)
    remove_rules(slot)
    remove_tmp(slot)
    return {"slot": slot, "killed": killed}


def reap_stale() -> list[dict]:
    """Clean every slot no live run holds but that left something behind (a harness and its watchdog killed)."""
    reaped = []
    if not ROOT.is_dir():
        return reaped
    for lock in ROOT.glob("slot-*.lock"):
        try:
            slot = int(lock.stem.split("-", 1)[1])
        except ValueError:
            continue
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            leftover = cgroup_pids(slot) or any(d.exists() for d in cgroup_dirs(slot)) or slot_dir(slot).exists()
            if leftover:
                reaped.append(clean_slot(slot))
        finally:
            os.close(fd)
    return reaped


@dataclass
class Sandbox:
    """One run's isolation: see the module's docstring. ``close()`` (or the harness's death) undoes it all."""

    label: str
    hide: list[Path] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    slot: int = -1
    user: str = ""
    uid: int = -1
    gid: int = -1
    ports: set[int] = field(default_factory=set)
    reaped: list[dict] = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        require()
        ROOT.mkdir(parents=True, exist_ok=True)
        os.chmod(ROOT, 0o755)
        self.reaped = reap_stale()
        self._lock_fd = self._take_slot()
        self._watchdog = None
        self._pipe_w = None
        try:
            self.user, self.uid, self.gid = ensure_user(self.slot)
            make_cgroups(self.slot, self.limits)
            make_rules(self.slot, self.uid)
            make_tmp(self.slot, self.uid, self.gid, self.limits.tmp_bytes)
            self._start_watchdog()
        except BaseException:
            self.close()
            raise

    def _take_slot(self) -> int:
        for slot in range(SLOTS):
            fd = os.open(_lock_path(slot), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    continue
                raise
            self.slot = slot
            clean_slot(slot)  # whatever an earlier holder left
            return fd
        raise IsolationError(f"all {SLOTS} isolation slots in {ROOT} are taken")

    def _start_watchdog(self) -> None:
        read_end, self._pipe_w = os.pipe()
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-m", "harness.isolation", "watchdog", str(self.slot), str(self.limits.wall_seconds)],
                stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                pass_fds=(self._lock_fd,), env={**os.environ, "HARNESS_LOCK_FD": str(self._lock_fd)},
                cwd=str(Path(__file__).resolve().parent.parent))
        finally:
            os.close(read_end)

    # --- spawning -------------------------------------------------------------------------------------------------
    def environment(self, env: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
        """A role's environment in the sandbox: whatever it inherited from the grader's own environment goes, even
        when its caller built ``env`` from :func:`base_environ` already (the runner and the load roles do)."""
        return scrubbed_env(env, base) | {"HOME": "/tmp", "TMPDIR": "/tmp", "USER": self.user, "LOGNAME": self.user}

    def command(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """``argv`` wrapped: join the cgroups, new mount namespace, limits, drop to the slot's user, exec."""
        self.allow(env)
        procs = [str(d / "cgroup.procs") for d in cgroup_dirs(self.slot)]
        join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 121; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", join, "harness-cgroup", *procs, "--",
                "unshare", "--mount", "--propagation", "private", "--",
                "/bin/sh", "-c", mount_script(self.slot, argv, env, self.hide), "harness-mounts",
                "prlimit", f"--fsize={self.limits.file_size_bytes}", "--core=0", "--",
                "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--",
                *(["/usr/bin/env", *(f"{k}={v}" for k, v in sorted(late_env(env).items()))] if late_env(env) else []),
                *argv]

    def allow(self, env: dict[str, str]) -> None:
        new = ports_in_env(env) - self.ports
        if new:
            allow_ports(self.slot, new)
            self.ports |= new

    # --- the end --------------------------------------------------------------------------------------------------
    def kill_all(self) -> list[int]:
        return kill_cgroup(self.slot) if self.slot >= 0 else []

    def describe(self) -> dict:
        return {"isolated": True, "user": self.user, "uid": self.uid, "slot": self.slot,
                "cgroup": cgroup_version() and f"v{cgroup_version()}", "cgroups": [str(d) for d in cgroup_dirs(self.slot)],
                "network": f"nftables table inet {nft_table(self.slot)}: loopback TCP to ports "
                           f"{sorted(self.ports)} only", "limits": asdict(self.limits),
                "mounts": "private /tmp /var/tmp /dev/shm (tmpfs), report folder hidden",
                "reaped_before": self.reaped}

    def close(self) -> dict:
        """Kill what is left, read the refused-packet counter, remove rules, cgroups and mounts; release the slot."""
        if self.closed or self.slot < 0:
            return {}
        self.closed = True
        summary = {"killed_at_end": self.kill_all(), "refused_packets": refused_packets(self.slot),
                   "probed_packets": refused_packets(self.slot, "probed"), "probed_ports": probed_ports(self.slot)}
        clean_slot(self.slot)
        wall = slot_dir(self.slot).parent / f"slot-{self.slot}.wall"
        if wall.exists():
            summary["wall_time_exceeded"] = True
            wall.unlink(missing_ok=True)
        if self._pipe_w is not None:
            os.close(self._pipe_w)  # the watchdog cleans once more (nothing left) and exits, releasing its lock copy
            self._pipe_w = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(15)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
        os.close(self._lock_fd)
        return summary


def run_contained(argv: list[str], env: dict[str, str], label: str, timeout: float, **popen) -> tuple[int, dict]:
    """Run one command of a submission to its end in a sandbox of its own (the adapter's setup command, which runs
    before the roles' supervisor exists): ``subprocess.run`` with the same isolation as a role, and whatever it left
    running killed at the end. Returns (exit code, the sandbox's record)."""
    sandbox = Sandbox(label)
    try:
        env = sandbox.environment(env)
        try:
            done = subprocess.run(sandbox.command(argv, env), env=outer_env(env), timeout=timeout,
                                  start_new_session=True,
                                  **popen)
            returncode = done.returncode
        except subprocess.TimeoutExpired:
            returncode = -signal.SIGKILL
    finally:
        summary = sandbox.close()
    return returncode, {**sandbox.describe(), "end": summary}


def late_env(env: dict[str, str]) -> dict[str, str]:
    """Variables set only for the role's own program, not for the wrapper before it: a preloaded library (the
    clock-skew roles' libfaketime) would otherwise load into the root shell that mounts, and its shared semaphore
    in the host's /dev/shm would be out of reach of the role once /dev/shm is its own."""
    return {k: v for k, v in env.items() if k == "LD_PRELOAD" or k.startswith("FAKETIME")}


def outer_env(env: dict[str, str]) -> dict[str, str]:
    """The environment to start the wrapper of ``Sandbox.command`` with (``late_env`` is set by its last step)."""
    late = late_env(env)
    return {k: v for k, v in env.items() if k not in late}


def scrubbed_env(env: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` without what it inherited from the harness's own environment ``base`` (default ``os.environ``):
    a variable stays when the runner set or changed it (the contract's variables, the adapter's [env]) or when it
    is one of KEEP_ENV (PATH, the locale)."""
    base = os.environ if base is None else base
    return {k: v for k, v in env.items()
            if k not in DROP_ENV and (k in KEEP_ENV or k not in base or base[k] != v)}


def base_environ() -> dict[str, str]:
    """The part of the harness's environment a role may start from (what ``run_environment`` could use in place of
    ``os.environ`` when isolating)."""
    return {k: v for k, v in os.environ.items() if k in KEEP_ENV}


# --- watchdog -------------------------------------------------------------------------------------------------------
def watchdog(slot: int, wall_seconds: float) -> int:
    """Wait for the harness's pipe (stdin) to close, or the wall time to pass; then kill the slot's cgroup and
    remove its rules and mounts. Holds a copy of the slot's lock until done, so no other run takes it meanwhile."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    deadline = time.monotonic() + wall_seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            (ROOT / f"slot-{slot}.wall").write_text(str(time.time()))
            kill_cgroup(slot)  # the run goes on without its roles; the harness cleans up at its end
            deadline = float("inf")
            continue
        ready, _, _ = select.select([0], [], [], min(left, 3600))
        if ready and not os.read(0, 4096):
            break
    clean_slot(slot)
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "watchdog":
        sys.exit(watchdog(int(sys.argv[2]), float(sys.argv[3])))
    if len(sys.argv) >= 2 and sys.argv[1] == "check":
        found = check()
        print("\n".join(found) or "isolation can be set up on this machine")
        sys.exit(1 if found else 0)
    print("usage: python -m harness.isolation check | watchdog SLOT WALL_SECONDS", file=sys.stderr)
    sys.exit(2)
