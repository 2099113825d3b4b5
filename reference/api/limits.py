"""Bounds of the upload path beyond one request (issue 10, defect 12).

``UploadGate``: at most ``MAX_CONCURRENT_UPLOADS`` uploads in progress in one API process; the next one is
answered ``503`` with ``Retry-After`` before its body is read (not accepted: the client retries later with the
same Idempotency-Key).

``DecodeSandbox``: the only pixel decoding the API does — the integrity check of a file that does not end with
its format's trailer (a 1/8-scale JPEG draft decode, PNG chunk verification) — runs in a pool of
``UPLOAD_DECODE_WORKERS`` single-process executors, with a time limit (``UPLOAD_DECODE_TIMEOUT_SECONDS``) that
counts the decode only: a request first waits for an idle process (bounded by the same limit, else ``503``),
then its own decode is timed. A decode past the limit gets ``422 decode_timeout`` and its process is killed and
replaced; the other processes, and the API's threads, are untouched. Processes come from ``forkserver`` (else
``spawn``), so none inherits a database or broker socket (CONTRACT §2).

This module stays light (no FastAPI import at module level): the sandbox processes import it to run
:func:`inspect_isolated`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
import multiprocessing
import warnings
from multiprocessing.context import BaseContext
from typing import IO, TYPE_CHECKING, Any

from PIL import Image

from reference.imaging import kill_pool, outlive_the_roles_stop_signal
from reference.inspection import UploadRejected, _ends_properly, inspect_image

if TYPE_CHECKING:
    from reference.inspection import ImageHeader

log = logging.getLogger("reference.api")


class UploadGate:
    """A non-blocking counter of uploads in progress (one event loop: no lock needed)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_progress = 0

    def try_enter(self) -> bool:
        if self.in_progress >= self.limit:
            return False
        self.in_progress += 1
        return True

    def leave(self) -> None:
        self.in_progress -= 1


def needs_decode(spool: IO[bytes], kind: str, size: int, tail: bytes) -> bool:
    """True when inspect_image would take its slow path (a decode): the file does not end with its format's
    trailer. The header-only check of every other file stays on an API thread."""
    spool.seek(0)
    head = spool.read(32)
    spool.seek(0)
    return not _ends_properly(kind, head, size, tail)


def _read_all(spool: IO[bytes]) -> bytes:
    spool.seek(0)
    data: bytes = spool.read()
    spool.seek(0)
    return data


def _init_process(max_pixels: int) -> None:
    outlive_the_roles_stop_signal()  # an upload decoding at the API's SIGTERM is answered, not broken
    Image.MAX_IMAGE_PIXELS = max_pixels
    warnings.simplefilter("error", Image.DecompressionBombWarning)


def _ready() -> bool:
    return True


def inspect_isolated(data: bytes, kind: str, size: int, tail: bytes, max_pixels: int,
                     max_side: int) -> tuple[Any, ...]:
    """Sandbox entry point: ``("ok", kind, width, height)`` or ``("rejected", status, code, message)``
    (UploadRejected does not survive pickling, its fields do)."""
    try:
        header = inspect_image(io.BytesIO(data), kind, size, tail, max_pixels=max_pixels, max_side=max_side)
    except UploadRejected as exc:
        return ("rejected", exc.status, exc.code, exc.message)
    return ("ok", header.kind, header.width, header.height)


class _Slot:
    """One sandbox process (a ProcessPoolExecutor of one), killed and replaced when a decode overruns."""

    def __init__(self, context: BaseContext, max_pixels: int):
        self.context, self.max_pixels = context, max_pixels
        self.executor = self._new()

    def _new(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=self.context,
                                                      initializer=_init_process, initargs=(self.max_pixels,))

    def warm_up(self) -> None:
        self.executor.submit(_ready).result()

    def recycle(self) -> None:
        old = self.executor
        self.executor = self._new()
        kill_pool(old)

    async def start(self, timeout: float) -> None:
        """Recycle until a fresh process answers within ``timeout`` (its start is never a request's)."""
        while True:
            self.recycle()
            try:
                await asyncio.wait_for(asyncio.wrap_future(self.executor.submit(_ready)), timeout)
                return
            except Exception as exc:  # noqa: BLE001 - a start that failed or hung: another process
                log.warning("image check process did not start (%s); retrying", type(exc).__name__)
                await asyncio.sleep(0.5)

    def shutdown(self) -> None:
        kill_pool(self.executor)


class DecodeSandbox:
    def __init__(self, workers: int, timeout_seconds: float, max_pixels: int, max_side: int,
                 retry_after_seconds: int = 2):
        self.workers, self.timeout = workers, timeout_seconds
        self.max_pixels, self.max_side, self.retry_after = max_pixels, max_side, retry_after_seconds
        self._slots: list[_Slot] = []
        self._idle: asyncio.Queue[_Slot] | None = None
        self._starting: set[asyncio.Task[None]] = set()
        self.start_timeout = max(10.0, timeout_seconds)

    def start(self) -> None:
        """Start the processes (blocking; call before opening connections, or from a thread)."""
        context: BaseContext
        try:
            context = multiprocessing.get_context("forkserver")
        except ValueError:  # pragma: no cover - platforms without forkserver
            context = multiprocessing.get_context("spawn")
        self._slots = [_Slot(context, self.max_pixels) for _ in range(self.workers)]
        for slot in self._slots:
            slot.warm_up()

    def shutdown(self) -> None:
        for task in list(self._starting):
            task.cancel()
        for slot in self._slots:
            slot.shutdown()

    def _replace(self, slot: _Slot, idle: asyncio.Queue[_Slot]) -> None:
        """Replace the slot's process in the background; the slot takes work again once its new process is ready,
        so a replacement's start is never charged to a check's time limit (issue 23 defect 1, the API's side)."""
        async def restart() -> None:
            await slot.start(self.start_timeout)
            idle.put_nowait(slot)

        task = asyncio.get_running_loop().create_task(restart())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def _queue(self) -> asyncio.Queue[_Slot]:
        if self._idle is None:
            if not self._slots:
                self.start()
            self._idle = asyncio.Queue()
            for slot in self._slots:
                self._idle.put_nowait(slot)
        return self._idle

    async def inspect(self, spool: IO[bytes], kind: str, size: int, tail: bytes) -> ImageHeader:
        """inspect_image of the spooled upload in a sandbox process; returns an ImageHeader or raises
        UploadRejected / ServiceUnavailable. The bytes are read only once a process is free (memory stays
        bounded by the number of processes, not of waiting requests)."""
        from reference.api.errors import ServiceUnavailable
        from reference.inspection import ImageHeader

        idle = self._queue()
        loop = asyncio.get_running_loop()
        waited_until = loop.time() + self.timeout
        data = None
        while True:
            try:
                slot = await asyncio.wait_for(idle.get(), max(0.0, waited_until - loop.time()))
            except asyncio.TimeoutError:
                raise ServiceUnavailable("decoder_busy", "every image check is busy, retry later",
                                         self.retry_after) from None
            try:
                if data is None:
                    data = await asyncio.to_thread(_read_all, spool)
                submitted = slot.executor.submit(inspect_isolated, data, kind, size, tail, self.max_pixels,
                                                 self.max_side)
                break
            except (concurrent.futures.process.BrokenProcessPool, RuntimeError):
                # Its process died while idle (an OOM kill): the executor refuses work at once. Replace it and
                # take the next idle process; this check has not started, so nothing of it is charged.
                log.warning("image check process found dead while idle: replacing it")
                self._replace(slot, idle)
            except BaseException:
                idle.put_nowait(slot)  # the read failed or the request was cancelled: the process is fine
                raise
        healthy = False
        try:
            future = asyncio.wrap_future(submitted)
            try:
                outcome = await asyncio.wait_for(future, self.timeout)
            except asyncio.TimeoutError:
                log.warning("image check over %.1fs: killing its process", self.timeout)
                raise UploadRejected(422, "decode_timeout",
                                     f"the image could not be checked within {self.timeout:g}s") from None
            except concurrent.futures.process.BrokenProcessPool:
                log.warning("image check process died")
                raise UploadRejected(422, "unreadable_image", "the image cannot be checked") from None
            healthy = True
        finally:
            if healthy:
                idle.put_nowait(slot)
            else:  # overran, died, or the request was cancelled mid-decode: back once its replacement is ready
                self._replace(slot, idle)
        if outcome[0] == "rejected":
            _, status, code, message = outcome
            raise UploadRejected(status, code, message)
        _, kind, width, height = outcome
        return ImageHeader(kind, width, height)
