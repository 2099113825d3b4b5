import io
import struct
import zlib

import pytest
from PIL import Image

from reference.inspection import UploadRejected, could_still_match, inspect_image, sanitize_filename, sniff


def encode(fmt: str, size=(64, 48), **kwargs) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk


def check(data: bytes, kind: str, **limits):
    return inspect_image(io.BytesIO(data), kind, len(data), data[-1024:],
                         max_pixels=limits.get("max_pixels", 40_000_000), max_side=limits.get("max_side", 20_000))


@pytest.mark.parametrize("fmt,kind", [("JPEG", "jpeg"), ("PNG", "png"), ("GIF", "gif"), ("WEBP", "webp")])
def test_sniffs_the_four_accepted_kinds(fmt, kind):
    data = encode(fmt)
    assert sniff(data[:12]) == kind
    header = check(data, kind)
    assert (header.width, header.height, header.kind) == (64, 48, kind)


@pytest.mark.parametrize("data", [b"<svg xmlns='http://www.w3.org/2000/svg'/>", b"%PDF-1.7", b"BM\x00\x00",
                                  b"RIFF\x00\x00\x00\x00WAVE", b"\x00" * 12])
def test_rejects_other_types_by_magic(data):
    assert sniff(data[:12]) is None


def test_early_mismatch_detection():
    assert could_still_match(b"\xff") and could_still_match(b"\x89PN") and could_still_match(b"RIFF\x01\x02")
    assert not could_still_match(b"<") and not could_still_match(b"<svg")


def test_pixel_bomb_header_is_rejected_without_decoding():
    data = png_header_only(20_000, 20_000)
    with pytest.raises(UploadRejected) as info:
        check(data, "png")
    assert (info.value.status, info.value.code) == (422, "too_many_pixels")


def test_pixel_cap_is_configurable():
    with pytest.raises(UploadRejected) as info:
        check(encode("PNG", (100, 100)), "png", max_pixels=5000)
    assert info.value.code == "too_many_pixels"


def test_truncated_jpeg_is_rejected():
    data = encode("JPEG", (400, 300), quality=95)
    cut = data[: len(data) // 2]
    with pytest.raises(UploadRejected) as info:
        check(cut, "jpeg")
    assert (info.value.status, info.value.code) == (422, "truncated_image")


def test_jpeg_with_data_after_eoi_is_accepted_by_the_slow_path():
    data = encode("JPEG", (64, 48)) + b"appended trailer bytes" * 10
    assert check(data, "jpeg").width == 64


@pytest.mark.parametrize("fmt,kind", [("PNG", "png"), ("GIF", "gif"), ("WEBP", "webp")])
def test_truncated_other_kinds_are_rejected(fmt, kind):
    data = encode(fmt, (300, 200))
    with pytest.raises(UploadRejected):
        check(data[: len(data) - 40], kind)


@pytest.mark.parametrize("raw,expected", [
    ("../../x.jpg", "x.jpg"),
    ("..\\..\\windows\\evil.png", "evil.png"),
    ("/etc/passwd", "passwd"),
    ("photo of me.jpg", "photo of me.jpg"),
    ("a\x00b\nc.gif", "abc.gif"),
    ("...", None),
    ("", None),
    (None, None),
    ("x/", None),
    ("bad<>|:*?.jpg", "bad_.jpg"),
])
def test_sanitize_filename(raw, expected):
    assert sanitize_filename(raw) == expected


def test_sanitize_keeps_extension_when_truncating():
    name = sanitize_filename("a" * 500 + ".jpeg")
    assert len(name) == 200 and name.endswith(".jpeg")
