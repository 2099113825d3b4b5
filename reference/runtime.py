"""Process plumbing shared by the long-running roles: logging, a stop event
wired to SIGTERM/SIGINT, and waiting that a stop interrupts."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import uuid


def configure_logging(role: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s {role}[%(process)d] %(name)s: %(message)s",
    )
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
