"""Input safety for uploads (CONTRACT §3): magic-byte sniffing, structural
integrity, header-only dimension check, and filename sanitising.

Nothing here trusts the client's Content-Type or filename.
"""

from __future__ import annotations

import re
import struct
import unicodedata
import warnings
from dataclasses import dataclass
from typing import IO

from PIL import Image

SNIFF_BYTES = 12

CONTENT_TYPES = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "gif": "image/gif",
    "webp": "image/webp",
}
PILLOW_FORMATS = {"jpeg": "JPEG", "png": "PNG", "gif": "GIF", "webp": "WEBP"}


class UploadRejected(Exception):
    """A client error with its HTTP status and stable error code."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def sniff(head: bytes) -> str | None:
    """Image kind from the first bytes, or None if not one of the four accepted kinds."""
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


def could_still_match(head: bytes) -> bool:
    """False once ``head`` can no longer become an accepted signature (early 415)."""
    signatures = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"RIFF")
    return any(sig.startswith(head[: len(sig)]) or head.startswith(sig) for sig in signatures)


@dataclass(frozen=True)
class ImageHeader:
    kind: str
    width: int
    height: int

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[self.kind]


def _ends_properly(kind: str, data: bytes, total_size: int, tail: bytes) -> bool:
    stripped = tail.rstrip(b"\x00\r\n\t ")
    if kind == "jpeg":
        return stripped.endswith(b"\xff\xd9")
    if kind == "png":
        return stripped.endswith(b"IEND\xaeB`\x82")
    if kind == "gif":
        return stripped.endswith(b"\x3b")
    if kind == "webp":
        (riff_size,) = struct.unpack("<I", data[4:8])
        return bool(riff_size + 8 <= total_size)
    return False


def inspect_image(fileobj: IO[bytes], kind: str, size: int, tail: bytes, *, max_pixels: int, max_side: int) -> ImageHeader:
    """Header-only Pillow check plus a cheap structural check for truncation.

    Dimensions come from the header (no pixel decoding). A file that does not
    end with its format's trailer gets a bounded slow path: a 1/8-scale draft
    decode for JPEG (tolerates data appended after the EOI marker), chunk CRC
    verification for PNG; other kinds are rejected as truncated.
    """
    fileobj.seek(0)
    head = fileobj.read(32)
    fileobj.seek(0)
    declared = _declared_size(kind, head)
    if declared is not None:  # fixed-offset headers: judged even when nothing else follows
        _check_dimensions(*declared, max_pixels=max_pixels, max_side=max_side)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(fileobj, formats=[PILLOW_FORMATS[kind]])
            width, height = image.size
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise UploadRejected(422, "too_many_pixels", f"image exceeds the pixel limit: {exc}") from None
        except Exception:
            raise UploadRejected(422, "unreadable_image", "the image header cannot be read") from None
    _check_dimensions(width, height, max_pixels=max_pixels, max_side=max_side)
    if not _ends_properly(kind, head, size, tail):
        if not _slow_integrity_check(fileobj, kind):
            raise UploadRejected(422, "truncated_image", "the image data is truncated")
    fileobj.seek(0)
    return ImageHeader(kind, width, height)


def _declared_size(kind: str, head: bytes) -> tuple[int, int] | None:
    if kind == "png" and len(head) >= 24 and head[12:16] == b"IHDR":
        return struct.unpack(">II", head[16:24])
    if kind == "gif" and len(head) >= 10:
        return struct.unpack("<HH", head[6:10])
    return None


def _check_dimensions(width: int, height: int, *, max_pixels: int, max_side: int) -> None:
    if width <= 0 or height <= 0:
        raise UploadRejected(422, "unreadable_image", "image has no pixels")
    if width * height > max_pixels:
        raise UploadRejected(422, "too_many_pixels", f"{width}x{height} exceeds the limit of {max_pixels} pixels")
    if max(width, height) > max_side:
        raise UploadRejected(422, "image_too_large", f"a side exceeds {max_side} pixels")


def _slow_integrity_check(fileobj: IO[bytes], kind: str) -> bool:
    fileobj.seek(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            image = Image.open(fileobj, formats=[PILLOW_FORMATS[kind]])
            if kind == "jpeg":
                image.draft("RGB", (max(1, image.size[0] // 8), max(1, image.size[1] // 8)))
                image.load()
                return True
            if kind == "png":
                image.verify()
                return True
            return False
    except Exception:
        return False


_UNSAFE = re.compile(r"[^\w.\- ]+", re.UNICODE)


def sanitize_filename(raw: str | None, max_length: int = 200) -> str | None:
    """Display-only filename: last path component, no control characters, no
    leading dots, bounded length. Never used in any storage key."""
    if not raw:
        return None
    name = unicodedata.normalize("NFKC", raw)
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C")
    name = _UNSAFE.sub("_", name).strip(" ._")
    if not name:
        return None
    if len(name) > max_length:
        stem, dot, ext = name.rpartition(".")
        if dot and 0 < len(ext) <= 10:
            name = stem[: max_length - len(ext) - 1] + "." + ext
        else:
            name = name[:max_length]
    return name
