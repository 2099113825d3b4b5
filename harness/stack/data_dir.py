"""The stack's data folder: short, private, temporary.

Service data (PostgreSQL's cluster, RabbitMQ's mnesia and queues, SeaweedFS's volumes) and every Unix socket live
here, never in the run directory. Two reasons:

- Linux limits a Unix socket path to 107 bytes, and a CI checkout sits deep
  (/home/runner/work/<repo>/<repo>/reports/runs/<run id>/stack/...): sockets need a short folder.
- The data is hundreds of MB after a grade and worthless afterwards; the run directory keeps the logs only,
  so a report folder fits a CI artifact. The stack removes this folder when it stops (unless asked to keep it).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

UNIX_SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
PREFIX = "hs-"
# Written into every data folder we make; nothing removes a folder without it (a stack.json can be edited by hand).
MARKER = ".harness-stack-data"
FALLBACK_TEMP_ROOT = Path("/tmp")
# A temporary root longer than this leaves too little room for the sockets below it.
SHORT_ROOT_MAX = 40


def _traversable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def short_temp_root() -> Path:
    """$TMPDIR when it is short and every user may traverse it (PostgreSQL runs as `postgres`), else /tmp."""
    candidate = Path(tempfile.gettempdir())
    try:
        if len(os.fsencode(candidate)) <= SHORT_ROOT_MAX and _traversable_by_others(candidate):
            return candidate
    except OSError:
        pass
    return FALLBACK_TEMP_ROOT


def new_data_dir(run_dir: Path) -> Path:
    """A fresh data folder such as /tmp/hs-k2j4x9ab, whatever the depth of `run_dir`."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=short_temp_root()))
    # Traverse-only for others: the `postgres` OS user must reach its own folder inside, nobody may list this one.
    os.chmod(path, 0o711)
    (path / MARKER).write_text(f"{run_dir}\n")
    return path


def socket_path(folder: Path, name: str) -> Path:
    """`folder/name`, refused if the kernel could not bind it (a service would die with a vague error instead)."""
    path = Path(folder) / name
    if len(os.fsencode(path)) > UNIX_SOCKET_PATH_MAX:
        raise ValueError(f"Unix socket path {path} is longer than {UNIX_SOCKET_PATH_MAX} bytes")
    return path


def remove_data_dir(path: Path | str | None) -> bool:
    """Remove a stack's data folder (only one carrying our marker). True when it is gone."""
    if not path:
        return True
    path = Path(path)
    if not path.exists():
        return True
    if not (path / MARKER).is_file():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()
