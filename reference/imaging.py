"""Pillow work of the worker: decode once, render the promised variants.

Runs inside a process pool started with ``forkserver``/``spawn`` (see
:func:`make_pool`), so a pool process never holds a broker or database socket
of the worker (DESIGN §4 pitfall). Output is deterministic for a given input
and Pillow build: the same effect key always gets the same bytes.
"""

from __future__ import annotations

import io
import multiprocessing
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from PIL import Image, ImageOps

THUMBNAIL_BOX = (256, 256)
CROP_SIZE = (512, 512)
OPTIMIZED_MAX_SIDE = 2048
WEBP_QUALITY = 80


@dataclass(frozen=True)
class Limits:
    max_pixels: int = 40_000_000
    max_side: int = 20_000
    max_frames: int = 100


@dataclass(frozen=True)
class RenderedVariant:
    name: str
    data: bytes
    content_type: str
    extension: str
    width: int
    height: int


class ImageRejected(Exception):
    """Permanent: this input will never render. ``code`` becomes the job's error_code."""

    def __init__(self, code: str, detail: str = ""):
        super().__init__(code, detail)
        self.code, self.detail = code, detail

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}" if self.detail else self.code


def _init_pool_process(max_pixels: int) -> None:
    Image.MAX_IMAGE_PIXELS = max_pixels
    # A decompression-bomb warning is an error here (DESIGN §8).
    warnings.simplefilter("error", Image.DecompressionBombWarning)


def kill_pool(executor) -> None:
    """Stop a process pool now, killing a process that is still busy (a render past its time limit): the executor
    has no public API for that, so its processes are read before the shutdown and killed."""
    processes = list((getattr(executor, "_processes", None) or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        try:
            process.kill()
        except Exception:
            pass


def make_pool(workers: int, limits: Limits) -> ProcessPoolExecutor:
    try:
        context = multiprocessing.get_context("forkserver")
        # Processes forked later (a replacement after a time limit) start with Pillow already imported.
        context.set_forkserver_preload(["reference.imaging"])
    except ValueError:  # pragma: no cover - platforms without forkserver
        context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_init_pool_process, initargs=(limits.max_pixels,)
    )


def _load(data: bytes, limits: Limits) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > limits.max_pixels:
            raise ImageRejected("too_many_pixels", f"{width}x{height}")
        if max(width, height) > limits.max_side:
            raise ImageRejected("image_too_large", f"{width}x{height}")
        frames = getattr(image, "n_frames", 1)
        if frames > limits.max_frames:
            raise ImageRejected("too_many_frames", f"{frames} frames")
        image.seek(0)
        image.load()
        image = ImageOps.exif_transpose(image)
    except ImageRejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageRejected("too_many_pixels", str(exc)[:200]) from None
    except Exception as exc:  # Pillow signals bad data with many exception types
        raise ImageRejected("decode_failed", f"{type(exc).__name__}: {str(exc)[:200]}") from None
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
    return image.convert("RGBA" if has_alpha else "RGB")


def _encode(name: str, image: Image.Image) -> RenderedVariant:
    buffer = io.BytesIO()
    # No exif/icc/xmp passed to save(): metadata is stripped on output.
    image.save(buffer, format="WEBP", quality=WEBP_QUALITY, method=4)
    return RenderedVariant(name, buffer.getvalue(), "image/webp", "webp", image.width, image.height)


def _thumbnail(image: Image.Image) -> Image.Image:
    copy = image.copy()
    copy.thumbnail(THUMBNAIL_BOX, Image.Resampling.LANCZOS)
    return copy


def _crop(image: Image.Image) -> Image.Image:
    side = min(CROP_SIZE[0], image.width, image.height)
    return ImageOps.fit(image, (side, side), Image.Resampling.LANCZOS)


def _optimized(image: Image.Image) -> Image.Image:
    if max(image.size) <= OPTIMIZED_MAX_SIDE:
        return image
    copy = image.copy()
    copy.thumbnail((OPTIMIZED_MAX_SIDE, OPTIMIZED_MAX_SIDE), Image.Resampling.LANCZOS)
    return copy


RENDERERS = {"thumbnail": _thumbnail, "crop": _crop, "optimized": _optimized}


def warm_up(limits: Limits) -> int:
    """Render a tiny image once (pool entry point), so a new pool process has loaded every codec it needs before
    its first real render: a cold start is never charged to a job's decode time limit."""
    buffer = io.BytesIO()
    Image.new("RGBA", (8, 8), (1, 2, 3, 4)).save(buffer, format="PNG")
    return len(render_variants(buffer.getvalue(), tuple(RENDERERS), limits))


def render_variants(data: bytes, variants: tuple[str, ...] | list[str], limits: Limits) -> list[RenderedVariant]:
    """Decode ``data`` once and render every requested variant (pool entry point)."""
    unknown = [v for v in variants if v not in RENDERERS]
    if unknown:
        raise ImageRejected("unknown_variant", ",".join(unknown))
    image = _load(data, limits)
    try:
        return [_encode(name, RENDERERS[name](image)) for name in variants]
    except ImageRejected:
        raise
    except MemoryError:
        raise ImageRejected("too_large_to_render") from None
    except Exception as exc:
        raise ImageRejected("encode_failed", f"{type(exc).__name__}: {str(exc)[:200]}") from None
