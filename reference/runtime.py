"""Process plumbing shared by the long-running roles: logging, a stop event
wired to SIGTERM/SIGINT, and waiting that a stop interrupts."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import uuid
from datetime import datetime, timezone

# Fields a log record may carry (``log.info(..., extra={"job_id": ...})``) that a JSON line names on their own, so a
# job's or an attachment's lines are found by a field, not by parsing the message.
CONTEXT_FIELDS = ("job_id", "attachment_id", "attempt", "fencing_token", "pipeline_version", "trace_id", "outcome")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (RFC 3339, UTC), level, role, pid, logger, message, the context fields the
    record carries, and the exception's text when there is one."""

    def __init__(self, role: str):
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname, "role": self.role, "pid": record.process, "logger": record.name,
            "message": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value if isinstance(value, (int, float, bool)) else str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(role: str, level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(role))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {role}[%(process)d] %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    for noisy in ("aiormq", "aio_pika", "botocore", "boto3", "urllib3", "psycopg.pool"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def process_identity(role: str) -> str:
    """One identity per process start (CONTRACT §8): never reused after a restart."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; True when the stop event ended the wait."""
    if seconds <= 0:
        return stop.is_set()
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
        return True
    except asyncio.TimeoutError:
        return False
