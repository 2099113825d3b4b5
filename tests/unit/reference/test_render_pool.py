"""RenderPool (issue 10, defect 1): the decode time limit bounds a render's own work, never its wait for a free
Pillow process, and a render stopped by the limit (or cancelled) takes no neighbour with it."""

from __future__ import annotations

import asyncio
import io

from PIL import Image, ImageDraw

from reference import imaging
from reference.worker import RenderPool

VARIANTS = ("thumbnail", "crop", "optimized")


def _png(side: int, shade: int) -> bytes:
    image = Image.new("RGB", (side, side), (shade, 40, 90))
    ImageDraw.Draw(image).ellipse((side // 5, side // 4, side // 2, side // 2), fill=(200, shade, 10))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


async def _outcome(pool: RenderPool, data: bytes) -> str:
    try:
        rendered = await pool.render(data, VARIANTS)
        return "ok" if [v.name for v in rendered] == list(VARIANTS) else "wrong"
    except imaging.ImageRejected as exc:
        return exc.code


def test_neighbours_queued_behind_a_slow_image_are_not_timed_out_and_only_its_process_is_replaced():
    async def scenario():
        pool = RenderPool(1, imaging.Limits(), timeout_seconds=0.4)  # one process: every neighbour queues
        pool.warm_up()
        try:
            slow = _png(4000, 1)  # seconds to decode and render
            small = [_png(64, shade) for shade in range(8)]
            outcomes = await asyncio.gather(_outcome(pool, slow), *(_outcome(pool, data) for data in small))
            assert outcomes == ["decode_timeout"] + ["ok"] * len(small)

            # A cancelled render (a drain) replaces its own process; a render queued behind it still runs.
            cancelled = asyncio.ensure_future(_outcome(pool, slow))
            queued = asyncio.ensure_future(_outcome(pool, small[0]))
            await asyncio.sleep(0.1)
            cancelled.cancel()
            assert await queued == "ok"
            assert len(pool.executors) == 1
        finally:
            pool.shutdown()

    asyncio.run(scenario())
