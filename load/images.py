"""A small seeded corpus of real images for load runs (kept apart from the harness: load never imports it)."""
from __future__ import annotations

import io
import random

from PIL import Image

FORMATS = (("JPEG", "image/jpeg", "jpg"), ("PNG", "image/png", "png"), ("WEBP", "image/webp", "webp"))


def corpus(seed: int, count: int = 16, min_side: int = 64, max_side: int = 640) -> list[tuple[str, bytes, str]]:
    """`count` (filename, bytes, content type) triples; the same seed gives the same bytes."""
    rng = random.Random(seed)
    images = []
    for i in range(count):
        fmt, content_type, ext = FORMATS[i % len(FORMATS)]
        size = (rng.randint(min_side, max_side), rng.randint(min_side, max_side))
        image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
        # A few rectangles so encoders have something to do (a flat image compresses to nothing).
        pixels = image.load()
        for _ in range(8):
            x0, y0 = rng.randrange(size[0]), rng.randrange(size[1])
            colour = tuple(rng.randrange(256) for _ in range(3))
            for x in range(x0, min(size[0], x0 + rng.randint(4, 64))):
                for y in range(y0, min(size[1], y0 + rng.randint(4, 64))):
                    pixels[x, y] = colour
        buffer = io.BytesIO()
        image.save(buffer, format=fmt)
        images.append((f"load-{i}.{ext}", buffer.getvalue(), content_type))
    return images
