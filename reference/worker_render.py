"""The worker's render pool: Pillow renders in child processes, one image at a time per process, each render under
its own time limit (reference/imaging.py does the rendering itself). Used by reference/worker.py; knows nothing of
the broker or the database."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeAlias

from reference import imaging, metrics

Rendered: TypeAlias = list[imaging.RenderedVariant]
Handoff: TypeAlias = asyncio.Future[ProcessPoolExecutor]  # a warmed-up replacement, handed to one render

log = logging.getLogger("reference.worker")

# A render whose header promises at most this many pixels per second of its time limit is retried once in a fresh
# process when it runs over the limit (issue 23 defect 12). About a third of the slowest throughput measured here
# (a 3 MP photo JPEG renders all three variants at ~14 MP/s, a 16 MP PNG at ~27 MP/s on one core).
CHEAP_DECODE_PIXELS_PER_SECOND = 5_000_000
# That retry is judged by its process's own CPU time (a process the machine starves of CPU is not slow), within this
# many limits of wall-clock time.
STARVED_WALL_FACTOR = 10


def _process_cpu_seconds(executor: ProcessPoolExecutor) -> float | None:
    """CPU time (user + system) used so far by the one process of a single-process executor, from /proc (Linux);
    None when it cannot be read."""
    try:
        (process,) = (getattr(executor, "_processes", None) or {}).values()
        with open(f"/proc/{process.pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except Exception:  # noqa: BLE001 - no /proc, no process yet, a process gone: judged by the wall clock
        return None


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # read, so that a render nobody awaits any more logs no "never retrieved" error


class _OverLimit(Exception):
    """A render ran over its time limit; its process is being replaced (``fresh``: the replacement, handed to
    this render only, or None)."""

    def __init__(self, fresh: Handoff | None):
        super().__init__("over the time limit")
        self.fresh = fresh


class RenderPool:
    """Pillow renders in child processes, each process rendering one image at a time.

    Every image worker is a single-process executor of its own. A render first waits for an idle process — outside
    its time limit — and only then starts its clock: the limit bounds the render's OWN decode and encode, never the
    time it queued behind a slow neighbour. A render over its limit (or cancelled) kills and replaces only its own
    process, so no neighbour's render is cancelled, broken or timed out by it; a replacement is warmed up before it
    takes work, so its start-up is not charged to the next render either. A process that dies while idle (an OOM
    kill) leaves an executor that refuses work: the render that finds it replaces it and takes the next idle one;
    a replacement that does not start within ``start_timeout`` is killed and another one started.

    A time-out is not always the image's fault: a process that got no CPU (a loaded machine) or a slow neighbour
    can push a small image past the limit. An image whose header promises a decode far below the limit
    (``promises_cheap_decode``) is therefore rendered once more, in the fresh process that replaced the one that
    timed out, with its own full limit — of CPU time, within STARVED_WALL_FACTOR limits of wall-clock time; only a
    second time-out makes it ``decode_timeout``. An image whose header promises an expensive decode is timed out
    at once."""

    def __init__(self, workers: int, limits: imaging.Limits, timeout_seconds: float,
                 start_timeout_seconds: float = 30.0):
        self.workers, self.limits, self.timeout = workers, limits, timeout_seconds
        self.start_timeout = start_timeout_seconds
        self.executors = {imaging.make_pool(1, limits) for _ in range(workers)}
        self.idle: asyncio.Queue[ProcessPoolExecutor] = asyncio.Queue()
        for executor in self.executors:
            self.idle.put_nowait(executor)
        self.starting: set[asyncio.Task[None]] = set()

    def warm_up(self) -> None:
        # Start the forkserver and every pool process now, before any socket is opened.
        for future in [executor.submit(imaging.warm_up, self.limits) for executor in self.executors]:
            future.result()

    async def render(self, data: bytes, variants: tuple[str, ...],
                     pixels: int | None = None) -> list[imaging.RenderedVariant]:
        """``pixels``: the image's dimensions as recorded from its header (the worker passes the attachment's);
        without them the header is read here (Pillow opens lazily, no pixel is decoded)."""
        cheap = self.promises_cheap_decode(data, pixels)
        while True:
            executor = await self.idle.get()  # queueing for a process is not part of the time limit
            try:
                future = asyncio.get_running_loop().run_in_executor(executor, imaging.render_variants, data,
                                                                    variants, self.limits)
                break
            except (concurrent.futures.process.BrokenProcessPool, RuntimeError):
                # Its process died while idle (an OOM killer, a cgroup kill): the executor refuses new work at
                # once. Replace it and take the next idle process; this render has not started, so nothing of it
                # is charged (issue 23 defect 1: a broken executor was neither returned nor replaced).
                self._replace(executor, "its idle process died")
        try:
            return await self._finish(executor, future, keep_replacement=cheap)
        except _OverLimit as over:
            fresh = over.fresh
        if fresh is None:
            raise imaging.ImageRejected("decode_timeout", f"over {self.timeout:g}s")
        # Its header promises a decode far below the limit: the time-out says more about the machine than about
        # the file. Once more, in the fresh process that replaced the one that timed out (issue 23 defect 12).
        log.warning("a render whose header promises a cheap decode ran over %gs; once more in a fresh process",
                    self.timeout)
        metrics.JOBS.labels("render_retried").inc()
        executor = await fresh  # cancelled while waiting: the replacement goes to the idle queue (_start)
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, imaging.render_variants, data, variants,
                                                                self.limits)
        except (concurrent.futures.process.BrokenProcessPool, RuntimeError):
            self._replace(executor, "its process died")
            raise concurrent.futures.process.BrokenProcessPool("a fresh render process died") from None
        try:
            return await self._finish(executor, future, keep_replacement=False, cpu_judged=True)
        except _OverLimit:
            raise imaging.ImageRejected("decode_timeout", f"over {self.timeout:g}s twice, the second time in a "
                                                          "fresh process") from None

    def promises_cheap_decode(self, data: bytes, pixels: int | None = None) -> bool:
        """True when the image's header (read without decoding) promises a render far below the time limit: at
        most CHEAP_DECODE_PIXELS_PER_SECOND x the limit pixels (the first frame's, which is all a render decodes).
        Unreadable: promises nothing."""
        if pixels is None:
            pixels = imaging.header_pixels(data)
        return pixels is not None and pixels <= CHEAP_DECODE_PIXELS_PER_SECOND * self.timeout

    async def _finish(self, executor: ProcessPoolExecutor, future: asyncio.Future[Rendered], keep_replacement: bool,
                      cpu_judged: bool = False) -> Rendered:
        """Wait for a render under the time limit. ``cpu_judged`` (the retry of a cheap image): past the limit of
        wall-clock time the render goes on while its process has used less CPU than the limit — it was starved by
        the machine, not slowed by the image — up to STARVED_WALL_FACTOR limits of wall-clock time."""
        started = time.monotonic()
        cpu_at_start = _process_cpu_seconds(executor) if cpu_judged else None
        if cpu_at_start is not None:
            future.add_done_callback(_retrieve)  # shielded below: its outcome is read even if nobody awaits it
        wait = self.timeout
        try:
            while True:
                try:
                    result = await asyncio.wait_for(future if cpu_at_start is None else asyncio.shield(future), wait)
                    break
                except asyncio.TimeoutError:
                    cpu = None if cpu_at_start is None else _process_cpu_seconds(executor)
                    if cpu is not None and cpu_at_start is not None:
                        used, elapsed = cpu - cpu_at_start, time.monotonic() - started
                        wall_left = self.timeout * STARVED_WALL_FACTOR - elapsed
                        if used < self.timeout and wall_left > 0:
                            wait = max(0.05, min(self.timeout - used, wall_left))
                            continue
                    raise _OverLimit(self._replace(executor, "decode time limit exceeded",
                                                   keep=keep_replacement)) from None
        except _OverLimit:
            raise
        except concurrent.futures.process.BrokenProcessPool:
            self._replace(executor, "its process died")
            raise
        except asyncio.CancelledError:
            self._replace(executor, "its render was cancelled")  # the process may still be busy with it
            raise
        except BaseException:
            self.idle.put_nowait(executor)  # the render itself raised (ImageRejected): the process is fine
            raise
        self.idle.put_nowait(executor)
        return result

    def _replace(self, executor: ProcessPoolExecutor, why: str, keep: bool = False) -> Handoff | None:
        """Kill ``executor``'s process and start a replacement. ``keep``: the warmed-up replacement is handed to the
        caller (the returned future) instead of the idle queue — unless the caller stopped waiting for it."""
        log.warning("replacing one image process: %s", why)
        self.executors.discard(executor)
        imaging.kill_pool(executor)
        replacement = imaging.make_pool(1, self.limits)
        self.executors.add(replacement)
        loop = asyncio.get_running_loop()
        handoff: Handoff | None = loop.create_future() if keep else None
        task = loop.create_task(self._start(replacement, handoff))
        self.starting.add(task)
        task.add_done_callback(self.starting.discard)
        return handoff

    async def _warm(self, executor: ProcessPoolExecutor) -> None:
        await asyncio.get_running_loop().run_in_executor(executor, imaging.warm_up, self.limits)

    async def _start(self, executor: ProcessPoolExecutor, handoff: Handoff | None = None) -> None:
        """Make the replacement's process ready, then let it take work (or hand it to the render waiting for it
        in ``handoff``). A start that fails or does not finish within ``start_timeout`` (a hung fork, a warm-up
        that never returns) is given up and another replacement tried: the slot is never lost."""
        try:
            while True:
                try:
                    await asyncio.wait_for(self._warm(executor), self.start_timeout)
                    break
                except Exception as exc:  # could not start (TimeoutError included): try a fresh one
                    log.warning("image process did not start (%s); retrying", type(exc).__name__)
                    self.executors.discard(executor)
                    imaging.kill_pool(executor)
                    executor = imaging.make_pool(1, self.limits)  # the slot is counted while it waits to retry
                    self.executors.add(executor)
                    await asyncio.sleep(0.5)
        except BaseException:
            if handoff is not None and not handoff.done():
                handoff.cancel()  # shut down: the render waiting for it ends too
            raise
        if executor not in self.executors:  # shut down meanwhile
            imaging.kill_pool(executor)
            if handoff is not None and not handoff.done():
                handoff.cancel()
        elif handoff is not None and not handoff.done():
            handoff.set_result(executor)
        else:
            self.idle.put_nowait(executor)

    def shutdown(self) -> None:
        for task in list(self.starting):
            task.cancel()
        for executor in list(self.executors):
            imaging.kill_pool(executor)
        self.executors.clear()
