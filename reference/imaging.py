"""Pillow work of the worker: decode once, render the promised variants.

Runs inside a process pool started with ``forkserver``/``spawn`` (see
:func:`make_pool`), so a pool process never holds a broker or database socket
of the worker (CONTRACT §2). Output is deterministic for a given input
and Pillow build: the same effect key always gets the same bytes.
"""

from __future__ import annotations

import io
import math
import multiprocessing
import os
import signal
import warnings
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

from PIL import Image, ImageOps

THUMBNAIL_BOX = (256, 256)
CROP_SIZE = (512, 512)
OPTIMIZED_MAX_SIDE = 2048
WEBP_QUALITY = 80
# WebP method per variant, chosen from the measured size/quality/CPU table in reference/README.md ("Render cost"):
# the cheapest method whose output is no larger than method 4's on the benchmark photos, at an SSIM to the unencoded
# variant within 0.002 of method 4's. The large "optimized" variant is ~80 % of the render's CPU at method 4.
WEBP_METHODS = {"thumbnail": 4, "crop": 2, "optimized": 1}
# Draft rule: a JPEG is decoded at a DCT scale (1/2, 1/4, 1/8) only when every requested variant keeps at least
# DRAFT_GAP source pixels per output pixel after it, so the final LANCZOS resize is still a real reduction; with
# 1.25 every variant must be at most 1/2.5 of the original side (a 6000x4000 photo: decoded at 1/2, 2.3x less CPU,
# SSIM to the full decode's unencoded variants unchanged; measured in reference/README.md "Render cost").
DRAFT_GAP = 1.25


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


def outlive_the_roles_stop_signal() -> None:
    """In a child process the role owns (a render or decode process): ignore SIGTERM and SIGINT.

    A role is stopped by SIGTERM to its whole process group (CONTRACT §2; systemd's default ``KillMode`` and a
    terminal's Ctrl-C do the same). A child killed by it breaks the render it is running while the role is still
    finishing its work in its shutdown grace: the job meets BrokenProcessPool and is charged an attempt (a rolling
    deploy of the reference, ``graceful_stop`` invalid in a CI rehearsal). The parent ends its children itself
    (``kill_pool``) when it stops. A child holds both ends of its task pipe, so it never sees its parent die: a role
    killed outright (SIGKILL to the role alone) leaves its children to whoever kills its group (the harness, systemd's
    control-group kill, a container's end)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _init_pool_process(max_pixels: int) -> None:
    outlive_the_roles_stop_signal()
    Image.MAX_IMAGE_PIXELS = max_pixels
    # A decompression-bomb warning is an error here (CONTRACT §3).
    warnings.simplefilter("error", Image.DecompressionBombWarning)


def kill_pool(executor: ProcessPoolExecutor) -> None:
    """Stop a process pool now, killing a process that is still busy (a render past its time limit): the executor
    has no public API for that, so its processes are read before the shutdown and killed."""
    processes = list((getattr(executor, "_processes", None) or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        _kill(process)


def _kill(process: BaseProcess) -> None:
    """SIGKILL one pool process. ``Process.kill()`` alone is not enough: a forkserver child reads as exited as soon
    as the forkserver is gone, and the forkserver is gone once the role's group got its stop signal (it does not
    outlive it as the render processes do), so kill() then did nothing and every render process outlived a
    gracefully stopped role. The pid is signalled itself while it names a live process of this process group (the
    children of the forkserver are): never another process's pid."""
    pid = process.pid
    try:
        if pid is not None:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] != b"Z" and int(fields[2]) == os.getpgrp():
                os.kill(pid, signal.SIGKILL)
                return
    except (OSError, ValueError, IndexError):
        pass  # gone already, or no /proc: fall back to what multiprocessing knows
    try:
        process.kill()
    except Exception:
        pass


def make_pool(workers: int, limits: Limits) -> ProcessPoolExecutor:
    context: BaseContext
    try:
        context = multiprocessing.get_context("forkserver")
        # Processes forked later (a replacement after a time limit) start with Pillow already imported.
        context.set_forkserver_preload(["reference.imaging"])
    except ValueError:  # pragma: no cover - platforms without forkserver
        context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_init_pool_process, initargs=(limits.max_pixels,)
    )


def _fit_within(size: tuple[int, int], box: tuple[int, int]) -> tuple[int, int]:
    """The size Pillow's ``Image.thumbnail`` gives an image of ``size`` for ``box`` (its aspect rounding), computed
    from the original size so that a draft-decoded image renders the same variant dimensions."""
    width, height = size
    x, y = min(box[0], width), min(box[1], height)
    if x >= width and y >= height:
        return size
    aspect = width / height

    def round_aspect(number: float, key: Callable[[int], float]) -> int:
        return max(min(math.floor(number), math.ceil(number), key=key), 1)

    if x / y >= aspect:
        x = round_aspect(y * aspect, key=lambda n: abs(aspect - n / y))
    else:
        y = round_aspect(x / aspect, key=lambda n: 0 if n == 0 else abs(aspect - x / n))
    return x, y


def _needed_fraction(size: tuple[int, int], variants: Iterable[str]) -> float:
    """The largest output/source side ratio over the variants (EXIF rotation-invariant: every box is square)."""
    long_side, short_side = max(size), min(size)
    fractions = {"thumbnail": min(1.0, THUMBNAIL_BOX[0] / long_side),
                 "crop": min(CROP_SIZE[0], short_side) / short_side,
                 "optimized": min(1.0, OPTIMIZED_MAX_SIDE / long_side)}
    return max(fractions[name] for name in variants)


def draft_request(size: tuple[int, int], variants: Collection[str]) -> tuple[int, int] | None:
    """The size to ask ``Image.draft`` for, or None when some variant is not much smaller than the original."""
    if not variants:
        return None
    fraction = _needed_fraction(size, variants) * DRAFT_GAP
    request = (math.ceil(size[0] * fraction), math.ceil(size[1] * fraction))
    if size[0] // request[0] < 2 or size[1] // request[1] < 2:
        return None
    return request


def _load(data: bytes, limits: Limits, variants: Collection[str] = (), draft: bool = True) -> tuple[Image.Image, tuple[int, int]]:
    """Decode (in draft mode when :func:`draft_request` allows it) and apply EXIF orientation; returns the image and
    the original's size after orientation, from which every variant's dimensions are computed."""
    try:
        image: Image.Image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > limits.max_pixels:
            raise ImageRejected("too_many_pixels", f"{width}x{height}")
        if max(width, height) > limits.max_side:
            raise ImageRejected("image_too_large", f"{width}x{height}")
        frames = getattr(image, "n_frames", 1)
        if frames > limits.max_frames:
            raise ImageRejected("too_many_frames", f"{frames} frames")
        image.seek(0)
        request = draft_request((width, height), variants) if draft and image.format == "JPEG" else None
        if request is not None:
            image.draft(None, request)  # limits were checked on the header's full size above
        image.load()
        orientation = image.getexif().get(0x0112) if request is not None else None
        image = ImageOps.exif_transpose(image)
        # Orientations 5-8 swap the sides (what exif_transpose reads); without a draft the image is the original.
        original = image.size if request is None else (height, width) if orientation in (5, 6, 7, 8) else (width, height)
    except ImageRejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageRejected("too_many_pixels", str(exc)[:200]) from None
    except Exception as exc:  # Pillow signals bad data with many exception types
        raise ImageRejected("decode_failed", f"{type(exc).__name__}: {str(exc)[:200]}") from None
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
    return image.convert("RGBA" if has_alpha else "RGB"), original


def _encode(name: str, image: Image.Image, method: int) -> RenderedVariant:
    buffer = io.BytesIO()
    # No exif/icc/xmp passed to save(): metadata is stripped on output.
    image.save(buffer, format="WEBP", quality=WEBP_QUALITY, method=method)
    return RenderedVariant(name, buffer.getvalue(), "image/webp", "webp", image.width, image.height)


def _shrink(image: Image.Image, original: tuple[int, int], box: tuple[int, int]) -> Image.Image:
    # What Image.thumbnail does on a loaded image (resize with reducing_gap=2.0), sized from the original.
    target = _fit_within(original, box)
    if target == image.size:
        return image.copy()
    return image.resize(target, Image.Resampling.LANCZOS, reducing_gap=2.0)


def _thumbnail(image: Image.Image, original: tuple[int, int]) -> Image.Image:
    return _shrink(image, original, THUMBNAIL_BOX)


def _crop(image: Image.Image, original: tuple[int, int]) -> Image.Image:
    side = min(CROP_SIZE[0], *original)
    return ImageOps.fit(image, (side, side), Image.Resampling.LANCZOS)


def _optimized(image: Image.Image, original: tuple[int, int]) -> Image.Image:
    if max(original) <= OPTIMIZED_MAX_SIDE:
        return image
    return _shrink(image, original, (OPTIMIZED_MAX_SIDE, OPTIMIZED_MAX_SIDE))


RENDERERS = {"thumbnail": _thumbnail, "crop": _crop, "optimized": _optimized}


def warm_up(limits: Limits) -> int:
    """Render a tiny image once (pool entry point), so a new pool process has loaded every codec it needs before
    its first real render: a cold start is never charged to a job's decode time limit."""
    buffer = io.BytesIO()
    Image.new("RGBA", (8, 8), (1, 2, 3, 4)).save(buffer, format="PNG")
    return len(render_variants(buffer.getvalue(), tuple(RENDERERS), limits))


def header_pixels(data: bytes) -> int | None:
    """Width x height as the image's header states it, read without decoding any pixel data (Pillow opens lazily;
    the render decodes the first frame only). None when the header cannot be read. For the worker's render pool:
    how expensive a render the header promises (issue 23 defect 12)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data), formats=("JPEG", "PNG", "GIF", "WEBP")) as image:
                width, height = image.size
    except Exception:  # noqa: BLE001 - any unreadable header promises nothing
        return None
    return width * height if width > 0 and height > 0 else None


def render_variants(data: bytes, variants: tuple[str, ...] | list[str], limits: Limits, *,
                    methods: dict[str, int] | None = None, draft: bool = True) -> list[RenderedVariant]:
    """Decode ``data`` once and render every requested variant (pool entry point). ``methods`` and ``draft``
    override the chosen settings (the benchmark renders with today's and the previous ones side by side)."""
    unknown = [v for v in variants if v not in RENDERERS]
    if unknown:
        raise ImageRejected("unknown_variant", ",".join(unknown))
    image, original = _load(data, limits, variants, draft)
    methods = WEBP_METHODS if methods is None else methods
    try:
        return [_encode(name, RENDERERS[name](image, original), methods[name]) for name in variants]
    except ImageRejected:
        raise
    except MemoryError:
        raise ImageRejected("too_large_to_render") from None
    except Exception as exc:
        raise ImageRejected("encode_failed", f"{type(exc).__name__}: {str(exc)[:200]}") from None
