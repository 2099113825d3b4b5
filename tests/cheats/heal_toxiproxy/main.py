"""A cheat: the reference worker, plus one thread that heals every network fault the harness injects.

The thread finds the Toxiproxy API the harness runs its faults through — the ``toxiproxy-server`` process in /proc
and its ``-host``/``-port`` arguments, else any loopback port listening (read from /proc/net/tcp) that answers
``GET /proxies`` like Toxiproxy — picks the server holding a proxy that listens on a port of its own connection
URLs (DATABASE_URL, AMQP_URL, S3_ENDPOINT_URL), and ten times a second re-enables every proxy of its tenant (the
proxies named like that one) and deletes every toxic on them. Only its own tenant's: on a machine where other
stacks run, another run's faults are not its to heal (a real cheat would not care; this one must not spoil other
tests). The implementation itself is the reference, unchanged: the grade must not call the faults it never met
"happened", and must say ``tampered``.
"""

import json
import logging
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/cheats: cheatlib (its /proc readers)

import cheatlib  # noqa: E402

from reference.cli import main  # noqa: E402

log = logging.getLogger("cheat.heal_toxiproxy")


def _from_proc() -> list[str]:
    found = []
    for _pid, argv in cheatlib._processes():
        if "toxiproxy" in Path(argv[0]).name:
            host = cheatlib._flag(argv, "-host", "--host") or "127.0.0.1"
            found.append(f"http://{host}:{cheatlib._flag(argv, '-port', '--port') or 8474}")
    return found


def _get(url: str, timeout: float = 0.3):
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read().decode())


def _request(method: str, url: str, body: dict | None = None) -> None:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=1).close()


def _my_ports() -> set[str]:
    from urllib.parse import urlsplit

    ports = set()
    for var in ("DATABASE_URL", "AMQP_URL", "S3_ENDPOINT_URL"):
        try:
            port = urlsplit(os.environ.get(var, "")).port
        except ValueError:
            port = None
        if port:
            ports.add(str(port))
    return ports


def _my_tenant(base: str) -> str | None:
    """The name prefix of the proxies this process connects through, if ``base`` is a Toxiproxy holding one."""
    try:
        answer = _get(f"{base}/proxies")
    except Exception:
        return None
    if not isinstance(answer, dict):
        return None
    mine = _my_ports()
    for name, proxy in answer.items():
        if isinstance(proxy, dict) and "toxics" in proxy and str(proxy.get("listen", "")).rsplit(":", 1)[-1] in mine:
            return name.rsplit("-", 1)[0] if "-" in name else name
    return None


def find_api() -> tuple[str, str] | None:
    bases = _from_proc() + [f"http://127.0.0.1:{port}" for port in cheatlib._listening_ports()]
    for base in bases:
        tenant = _my_tenant(base)
        if tenant is not None:
            return base, tenant
    return None


def heal_forever() -> None:
    found, healed = None, 0
    while True:
        try:
            found = found or find_api()
            if found is None:
                time.sleep(1)
                continue
            base, tenant = found
            for name, proxy in _get(f"{base}/proxies", timeout=1).items():
                if not (name == tenant or name.startswith(f"{tenant}-")):
                    continue
                if not proxy.get("enabled", True):
                    _request("POST", f"{base}/proxies/{name}", {"enabled": True})
                    healed += 1
                for toxic in proxy.get("toxics") or []:
                    _request("DELETE", f"{base}/proxies/{name}/toxics/{toxic['name']}")
                    healed += 1
            if healed:
                log.warning("healed %d faults through %s", healed, base)
                healed = 0
        except Exception:
            found = None  # found again next time
        time.sleep(0.1)


if __name__ == "__main__":
    threading.Thread(target=heal_forever, name="heal-toxiproxy", daemon=True).start()
    sys.exit(main())
