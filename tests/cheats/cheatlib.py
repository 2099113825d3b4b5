"""The cheats of tests/cheats/*/ (README.md there): each a function run in a thread of the worker role.

Every cheat prints one line ``CHEAT <name>: <what it achieved>`` to the role's log (``achieved`` or ``blocked`` as
the second word, then the details), so a test and a person read what it managed from the run's logs/worker.log.
The cheats act on the grader the way a hostile submission would, but each is bounded so that a run without
isolation does not take the machine down with it: the fork bomb stops at 1500 processes, the disk filler at 1 GiB.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

FORK_CAP = 1500
DISK_CAP = 1 << 30


def say(name: str, achieved: bool, details: str) -> None:
    print(f"CHEAT {name}: {'achieved' if achieved else 'blocked'} {details}", file=sys.stderr, flush=True)


def _processes():
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and argv[0]:
            yield int(proc.name), argv


def _listening_ports(uid: int | None = None) -> list[int]:
    """Every listening TCP port, or only those of sockets owned by ``uid``."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 7 and fields[3] == "0A" and (uid is None or int(fields[7]) == uid):  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _flag(argv: list[str], *names: str) -> str | None:
    for flag, value in zip(argv, argv[1:]):
        if flag in names:
            return value
    return None


# --- the cheats ---------------------------------------------------------------------------------------------------
def toxiproxy_api() -> None:
    """Reach the Toxiproxy API (found in /proc): with it every fault of every tenant can be healed or injected."""
    for _pid, argv in _processes():
        if "toxiproxy" in Path(argv[0]).name:
            url = f"http://{_flag(argv, '-host', '--host') or '127.0.0.1'}:{_flag(argv, '-port', '--port') or 8474}"
            try:
                with urllib.request.urlopen(f"{url}/proxies", timeout=3) as response:
                    proxies = json.load(response)
                say("toxiproxy_api", True, f"listed {len(proxies)} proxies of every tenant at {url}")
            except Exception as exc:
                say("toxiproxy_api", False, f"{url}: {exc!r}")
            return
    say("toxiproxy_api", False, "no toxiproxy process visible")


def open_ports() -> None:
    """Connect to every listening loopback port: the management API, the services' direct ports, the harness."""
    import re

    # Its own: the ports its environment names, and its own submission's listeners (its other roles' HTTP and
    # metrics ports, which the sandbox lets every role of the submission reach).
    mine = {int(p) for value in os.environ.values() for p in re.findall(r"127\.0\.0\.1:(\d+)", value)}
    mine |= {int(v) for k, v in os.environ.items() if k.endswith("PORT") and v.isdigit()}
    if os.getuid() != 0:  # isolated: a user of its own (unisolated, as root, every listener would count)
        mine |= set(_listening_ports(os.getuid()))
    ports = _listening_ports()
    reached = []
    for port in ports:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                reached.append(port)
        except OSError:
            pass
    foreign = [p for p in reached if p not in mine]
    say("open_ports", bool(foreign), f"connected to {len(reached)} of {len(ports)} listening ports, {len(foreign)} "
        f"of them not named in its environment (e.g. {foreign[:8]})")


def direct_database() -> None:
    """Connect to PostgreSQL's own port (not the tenant's proxy) as the superuser and read other tenants' data."""
    import psycopg

    for _pid, argv in _processes():
        if Path(argv[0]).name == "postgres" and _flag(argv, "-p"):
            port = _flag(argv, "-p")
            try:
                url = f"postgresql://harness:harness@127.0.0.1:{port}/postgres"
                with psycopg.connect(url, connect_timeout=3) as conn:
                    names = [r[0] for r in conn.execute("select datname from pg_database where not datistemplate")]
                say("direct_database", True, f"superuser on port {port}: {len(names)} databases of every tenant, "
                    f"e.g. {sorted(names)[:3]}")
            except Exception as exc:
                say("direct_database", False, f"port {port}: {type(exc).__name__}: {str(exc).strip()[:160]}")
            return
    say("direct_database", False, "no postgres process visible")


def other_tenants() -> None:
    """Through its own proxies, with the credentials it was given: connect to the other databases of the cluster
    (the server lists their names to anyone) and list the other buckets — every tenant's data, were the credentials
    the stack's administrator's."""
    import urllib.parse

    import boto3
    import psycopg

    reached, refused = [], []
    own = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    own_db = own.path.lstrip("/")
    try:
        with psycopg.connect(os.environ["DATABASE_URL"], connect_timeout=3) as conn:
            names = [r[0] for r in conn.execute("select datname from pg_database where datallowconn")]
    except Exception as exc:
        names = ["postgres"]
        refused.append(f"own database: {type(exc).__name__}")
    for name in [n for n in names if n != own_db][:5]:
        try:
            with psycopg.connect(own._replace(path=f"/{name}").geturl(), connect_timeout=3) as conn:
                tables = conn.execute("select count(*) from information_schema.tables "
                                      "where table_schema = 'public'").fetchone()[0]
            reached.append(f"database {name} ({tables} tables)")
        except Exception as exc:
            refused.append(f"database {name}: {str(exc).strip().splitlines()[0][:80]}")
    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"])
    try:
        buckets = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    except Exception as exc:
        buckets = []
        refused.append(f"bucket list: {type(exc).__name__}")
    for bucket in [b for b in buckets if b != os.environ["S3_BUCKET"]][:5]:
        try:
            count = s3.list_objects_v2(Bucket=bucket, MaxKeys=5).get("KeyCount", 0)
            reached.append(f"bucket {bucket} ({count} keys listed)")
        except Exception as exc:
            refused.append(f"bucket {bucket}: {type(exc).__name__}")
    say("other_tenants", bool(reached), f"reached {reached[:4]}; refused {refused[:4]}")


def forge_tap() -> None:
    """Publish a made-up job message straight into the harness's tap queue (the default exchange routes by queue
    name): what the harness believes reached the work queue is then partly the submission's say."""
    import asyncio
    import uuid

    import aio_pika

    async def publish() -> None:
        connection = await aio_pika.connect(os.environ["AMQP_URL"], timeout=5)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            body = json.dumps({"job_id": str(uuid.uuid4()), "attachment_id": str(uuid.uuid4()), "attempt": 1,
                               "pipeline_version": 1}).encode()
            await channel.default_exchange.publish(aio_pika.Message(body, message_id=str(uuid.uuid4())),
                                                   routing_key="harness.tap")

    try:
        asyncio.run(publish())
        say("forge_tap", True, "published a made-up job message into harness.tap (confirmed)")
    except Exception as exc:
        say("forge_tap", False, f"{type(exc).__name__}: {str(exc)[:160]}")


def signal_harness() -> None:
    """Stop the harness (the parent process) for a moment, then let it go on: it could as well be killed."""
    parent = os.getppid()
    try:
        os.kill(parent, signal.SIGSTOP)
        time.sleep(0.2)
        os.kill(parent, signal.SIGCONT)
        say("signal_harness", True, f"stopped the harness (pid {parent}) for 0.2 s")
    except OSError as exc:
        say("signal_harness", False, f"pid {parent}: {exc!r}")


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def kill_others() -> None:
    """SIGKILL the Toxiproxy server of its own stack (every tenant's links and faults go through it) and the roles of
    other submissions graded beside it. Only processes the harness started itself (siblings: same parent) are
    aimed at, so that even a run without isolation harms nothing else on the machine."""
    ours, harness, me = os.environ.get("DATABASE_URL", ""), os.getppid(), os.getsid(0)
    killed, refused = [], []
    for pid, argv in _processes():
        if _ppid(pid) != harness or pid == os.getpid():
            continue
        try:
            if os.getsid(pid) == me:
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            urls = [e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"DATABASE_URL=")]
            other_role = bool(urls) and urls[0] != ours
        except OSError:  # not even readable: another user's process (another submission, a service)
            other_role = True
        if "toxiproxy" in Path(argv[0]).name or other_role:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
            except OSError as exc:
                refused.append(f"{pid}:{exc.errno}")
    say("kill_others", bool(killed), f"killed {killed}; refused {refused[:5]}")


FORK_BOMB = """
import os, signal, sys
children, error = [], "none"
while len(children) < int(sys.argv[1]):
    try:
        pid = os.fork()
    except OSError as exc:
        error = repr(exc)
        break
    if pid == 0:
        try:
            os.execv("/bin/sleep", ["sleep", "600"])
        finally:
            os._exit(0)
    children.append(pid)
print(len(children), error, flush=True)
for pid in children:  # then let the run go on
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass
"""


def fork_bomb() -> None:
    """Start sleeping processes until the system refuses (capped at FORK_CAP), from a small interpreter of its own
    (forking the role's big process is slow), then kill them."""
    import subprocess

    done = subprocess.run([sys.executable, "-S", "-c", FORK_BOMB, str(FORK_CAP)], capture_output=True, text=True)
    started, _, error = done.stdout.strip().partition(" ")
    count = int(started) if started.isdigit() else 0
    say("fork_bomb", count >= FORK_CAP, f"started {count} processes; stopped by {error or done.stderr[-200:]}")


def fill_disk() -> None:
    """Write one big file into the temporary folder (capped at DISK_CAP)."""
    folder = os.environ.get("TMPDIR") or "/tmp"
    path = Path(folder) / f"cheat-fill-{os.getpid()}"
    written, error, chunk = 0, "none", b"\0" * (16 << 20)
    try:
        with open(path, "wb") as f:
            while written < DISK_CAP:
                f.write(chunk)
                f.flush()
                written += len(chunk)
    except OSError as exc:
        error = repr(exc)
    finally:
        try:
            path.unlink()
        except OSError:
            pass
    say("fill_disk", written >= DISK_CAP, f"wrote {written >> 20} MiB into {folder}; stopped by {error}")


def daemonize() -> None:
    """Double fork + setsid: a process in a session of its own, out of the role's process group, sleeping on."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            os.execv("/bin/sleep", ["sleep", "3600"])
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(write_end)
    daemon = int(os.read(read_end, 32) or b"0")
    say("daemonize", True, f"daemon pid {daemon} in a session of its own (sid {os.getsid(daemon)})")


def write_reports() -> None:
    """Find the run's report folder through the role's own log (fd 1) and write into it."""
    try:
        log = Path(os.readlink("/proc/self/fd/1"))
    except OSError as exc:
        say("write_reports", False, f"cannot read fd 1: {exc!r}")
        return
    run_dir = log.parent.parent
    try:
        (run_dir / "CHEAT_WAS_HERE").write_text("a submission wrote into the grader's report folder\n")
        with open(run_dir / "history.jsonl", "a"):
            pass  # opened for writing: it could append events of its own
        say("write_reports", True, f"wrote {run_dir}/CHEAT_WAS_HERE and opened history.jsonl for writing")
    except OSError as exc:
        say("write_reports", False, f"{run_dir}: {exc!r}")


# In the order all_at_once runs them: the ones that break the run (kill_others kills Toxiproxy when it can) last.
CHEATS = {f.__name__: f for f in (toxiproxy_api, open_ports, direct_database, other_tenants, forge_tap,
                                   signal_harness, write_reports, fill_disk, daemonize, kill_others, fork_bomb)}


def launch(names: list[str], delay: float = 0.0) -> None:
    """Run the named cheats one after another in a thread, ``delay`` seconds after the role started (the run's
    faults and the other roles are up by then); once per run (a marker in the run's temporary folder), so a second
    worker instance or a restarted worker does not cheat again."""
    marker = Path(os.environ.get("TMPDIR") or "/tmp") / "cheats-started"
    try:  # once per run: a restarted worker does not cheat again
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)
    except OSError:
        return

    def run() -> None:
        time.sleep(delay)
        for name in names:
            try:
                CHEATS[name]()
            except Exception as exc:  # a cheat that crashed reports it
                say(name, False, f"crashed: {exc!r}")
        print("CHEAT done", file=sys.stderr, flush=True)

    threading.Thread(target=run, name="cheats", daemon=True).start()
