"""The seeded workload: a corpus of generated images plus bad inputs, and the upload client.

The same seed yields byte-identical files, names and Idempotency-Keys, so a
failing run can be replayed exactly (`harness run SCENARIO --seed N`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import random
import struct
import time
import zipfile
import zlib
from dataclasses import dataclass

from PIL import Image, ImageDraw

from .seeding import seeded_uuid, stream

FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg"), "webp": ("WEBP", "image/webp"),
           "gif": ("GIF", "image/gif")}


@dataclass(frozen=True)
class UploadOp:
    op: str
    kind: str  # good | bad (rejected or failed) | poison (accepted by type sniffing, fails decoding)
    #            | heavy (a valid image slow to decode: ready, or refused/failed by a pixel or decode time limit)
    fmt: str
    filename: str
    content_type: str
    data: bytes
    idempotency_key: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def describe(self) -> dict:
        return {"op": self.op, "kind": self.kind, "format": self.fmt, "filename": self.filename,
                "size": len(self.data), "sha256": self.sha256, "idempotency_key": self.idempotency_key}


def generate_image(rng: random.Random, fmt: str, max_side: int = 96, min_side: int = 16) -> bytes:
    width, height = rng.randint(min_side, max_side), rng.randint(min_side, max_side)
    image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(1, 6)):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        x1, y1 = rng.randint(x0, width), rng.randint(y0, height)
        colour = tuple(rng.randrange(256) for _ in range(3))
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)((x0, y0, x1, y1), fill=colour)
    out = io.BytesIO()
    pil_format = FORMATS[fmt][0]
    if pil_format == "GIF":
        image = image.convert("P")
    image.save(out, format=pil_format, **({"quality": 80} if pil_format in ("JPEG", "WEBP") else {}))
    return out.getvalue()


def bad_input(rng: random.Random) -> tuple[bytes, str, str]:
    """A file no image pipeline may accept as an image: (bytes, extension, claimed content type)."""
    choice = rng.choice(["text", "empty", "html"])
    if choice == "text":
        return (f"not an image {rng.random()}\n" * 4).encode(), "png", "image/png"
    if choice == "empty":
        return b"", "jpeg", "image/jpeg"
    return b"<html><body>hello</body></html>", "gif", "image/gif"


def poison_input(rng: random.Random, max_side: int) -> tuple[bytes, str, str]:
    """A PNG whose header and trailer are intact but whose pixel data is garbage.

    It passes type sniffing and header/trailer checks at upload, so an implementation accepts it and only
    its decoder finds out: it must end ``failed`` with an error_code (or be refused with a 4xx), never loop.
    """
    data = bytearray(generate_image(rng, "png", max_side))
    start = data.index(b"IDAT") + 4 + 2  # keep the zlib header so the stream starts like a real one
    length = int.from_bytes(data[start - 10:start - 6], "big") - 2
    for i in range(start, start + max(1, length - 4)):
        data[i] = rng.randrange(256)
    return bytes(data), "png", FORMATS["png"][1]


def heavy_input(rng: random.Random, side: int) -> tuple[bytes, str, str]:
    """A valid PNG of ``side`` x ``side`` pixels (16 MP at the default 4000: under the contract's ~40 MP cap) that
    compresses well (a small upload) but takes a second or more to decode and render.

    An implementation may render it (``ready``) or refuse it — a 4xx at upload, or ``failed`` with an error_code from
    a pixel or decode time limit; either way it must end terminal, and its neighbours must not suffer from it."""
    image = Image.new("RGB", (side, side), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    for _ in range(24):
        x0, y0 = rng.randrange(side), rng.randrange(side)
        x1, y1 = min(side, x0 + rng.randrange(1, side // 2)), min(side, y0 + rng.randrange(1, side // 2))
        draw.ellipse((x0, y0, x1, y1), fill=tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue(), "png", FORMATS["png"][1]


POSITIONS = ("first", "middle", "last")


def plan(seed: int, uploads: int, bad: int = 0, poison: int = 0, max_side: int = 96,
         poison_at: tuple[str, ...] | list[str] = (), min_side: int = 16, heavy: int = 0,
         heavy_side: int = 4000, hostile: tuple[str, ...] | list[str] = ()) -> list[UploadOp]:
    """The deterministic list of uploads for ``seed``, shuffled so bad inputs sit among good ones.

    ``poison_at`` (``first`` / ``middle`` / ``last``) pins that many of the ``poison`` items to those positions of
    upload order (batch independence: the failing item leads, sits inside or closes a batch); the rest shuffle.
    ``min_side`` makes every good image at least that large (work whose processing time is predictable).
    ``heavy`` valid-but-slow images (:func:`heavy_input`, ``heavy_side`` pixels a side) are spread evenly through
    upload order, from a random stream of their own: a plan without them is the same as before they existed.
    ``hostile`` kinds (:data:`HOSTILE_KINDS`, one upload each, repeats allowed) are spread the same way afterwards,
    from a stream of their own too."""
    rng = stream(seed, "workload")
    if len(poison_at) > poison or any(p not in POSITIONS for p in poison_at):
        raise ValueError(f"poison_at {list(poison_at)} needs as many poison items and positions among {POSITIONS}")
    kinds = ["good"] * uploads + ["bad"] * bad + ["poison"] * (poison - len(poison_at))
    rng.shuffle(kinds)
    total = len(kinds) + len(poison_at)
    for index in sorted({"first": 0, "middle": total // 2, "last": total - 1}[p] for p in poison_at):
        kinds.insert(index, "poison")
    ops = []
    for index, kind in enumerate(kinds):
        if kind == "good":
            fmt = rng.choice(sorted(FORMATS))
            data, content_type = generate_image(rng, fmt, max_side, min(min_side, max_side)), FORMATS[fmt][1]
        elif kind == "bad":
            data, fmt, content_type = bad_input(rng)
        else:
            data, fmt, content_type = poison_input(rng, max_side)
        stem = f"{rng.choice(['holiday', 'scan', 'avatar', 'receipt', 'photo'])}-{rng.getrandbits(32):08x}"
        ops.append(UploadOp(op=f"u{index:04d}", kind=kind, fmt=fmt, filename=f"{stem}.{fmt}",
                            content_type=content_type, data=data, idempotency_key=seeded_uuid(rng)))
    if heavy:
        ops = _with_heavy(ops, stream(seed, "workload-heavy"), heavy, heavy_side)
    if hostile:
        ops = _with_hostile(ops, stream(seed, "workload-hostile"), list(hostile))
    return ops


def _with_heavy(ops: list[UploadOp], rng: random.Random, heavy: int, side: int) -> list[UploadOp]:
    total = len(ops) + heavy
    at = {min(total - 1, int((k + 0.5) * total / heavy)) for k in range(heavy)}
    mixed, rest = [], iter(ops)
    for index in range(total):
        if index in at:
            data, fmt, content_type = heavy_input(rng, side)
            stem = f"{rng.choice(['panorama', 'scan', 'poster'])}-{rng.getrandbits(32):08x}"
            op = UploadOp(op="", kind="heavy", fmt=fmt, filename=f"{stem}.{fmt}", content_type=content_type,
                          data=data, idempotency_key=seeded_uuid(rng))
        else:
            op = next(rest)
        mixed.append(dataclasses.replace(op, op=f"u{index:04d}"))
    return mixed


# Hostile inputs (CONTRACT §3 input safety): small uploads that attack the decoder, not the network. Each is
# recorded under its own kind; harness/checkers/hostile_inputs.py says which outcomes each kind allows.
HOSTILE_KINDS = ("bomb", "huge_dims", "frame_bomb", "truncated_progressive", "polyglot", "mislabeled")


def _png(width: int, height: int, bit_depth: int, colour_type: int, idat: bytes, trailer: bytes = b"") -> bytes:
    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
            + trailer)


def bomb_input(rng: random.Random) -> tuple[bytes, str, str]:
    """A decompression bomb: a complete, valid 1-bit PNG of 64-90 MP (well past the contract's ~40 MP pixel cap)
    whose pixel data is one colour, so it compresses to a few KB. Refused at upload (4xx) or ``failed``; never
    ``ready``."""
    width, height = rng.randint(8000, 9500), rng.randint(8000, 9500)
    fill = b"\xff" if rng.random() < 0.5 else b"\x00"
    row = b"\x00" + fill * ((width + 7) // 8)  # filter byte "none", then the packed pixels
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    return _png(width, height, 1, 0, idat), "png", FORMATS["png"][1]


def huge_dims_input(rng: random.Random) -> tuple[bytes, str, str]:
    """A well-formed header declaring gigapixel dimensions, followed by almost no data: PNG (30 000² RGB), GIF
    (a 65 535² logical screen around a 1x1 frame) or JPEG (its SOF patched to 60 000²). A decoder that trusts
    the header allocates gigabytes. Refused at upload (4xx) or ``failed``; never ``ready``."""
    choice = rng.choice(["png", "gif", "jpeg"])
    if choice == "png":
        side = rng.randint(30_000, 50_000)
        return _png(side, side, 8, 2, zlib.compress(b"\x00" * 64)), "png", FORMATS["png"][1]
    if choice == "gif":
        data = (b"GIF89a" + struct.pack("<HHBBB", 65535, 65535, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
                + b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00" + b"\x3b")
        return data, "gif", FORMATS["gif"][1]
    data = bytearray(generate_image(rng, "jpeg", 32, 16))
    sof = next(i for i in range(2, len(data) - 9) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC2))
    side = rng.randint(60_000, 65_000)
    data[sof + 5:sof + 9] = struct.pack(">HH", side, side)  # height, width
    return bytes(data), "jpeg", FORMATS["jpeg"][1]


def frame_bomb_input(rng: random.Random, webp: bool | None = None) -> tuple[bytes, str, str]:
    """An animation of thousands of one-pixel frames (at most ~150 KB): a GIF of 2 500-4 000 frames or an animated
    WebP of 2 000-2 800 (lossless 1x1 frames). Each frame is valid and tiny, so the cost is the count: far past any
    frame cap. Refused at upload (4xx) or ``failed``; never ``ready``. ``webp`` picks the format (None: at random)."""
    side = 64
    if rng.random() < 0.5 if webp is None else webp:
        return _webp_frame_bomb(rng.randint(2000, 2800), side), "webp", FORMATS["webp"][1]
    frames = rng.randint(2500, 4000)
    data = bytearray(b"GIF89a" + struct.pack("<HHBBB", side, side, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff")
    data += b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00"  # loop forever
    for i in range(frames):
        data += b"\x21\xf9\x04\x00\x01\x00\x00\x00"  # graphic control: 10 ms
        # A 1x1 frame at a moving position; LZW (min code size 2): clear, pixel 0, end.
        data += b"\x2c" + struct.pack("<HHHHB", i % side, (i // side) % side, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    data += b"\x3b"
    return bytes(data), "gif", FORMATS["gif"][1]


def _webp_frame_bomb(frames: int, side: int) -> bytes:
    def chunk(tag: bytes, body: bytes) -> bytes:
        return tag + struct.pack("<I", len(body)) + body + (b"\x00" if len(body) % 2 else b"")

    def u24(value: int) -> bytes:
        return struct.pack("<I", value)[:3]

    one = io.BytesIO()
    Image.new("RGB", (1, 1), (200, 10, 10)).save(one, format="WEBP", lossless=True)
    frame = one.getvalue()[12:]  # its VP8L chunk, header included
    body = chunk(b"VP8X", b"\x02\x00\x00\x00" + u24(side - 1) + u24(side - 1))  # animation flag, canvas
    body += chunk(b"ANIM", b"\x00\x00\x00\x00" + struct.pack("<H", 0))  # background, loop forever
    for i in range(frames):  # offsets count in pairs of pixels; width-1, height-1 = 0; 10 ms
        body += chunk(b"ANMF", u24(i % (side // 2)) + u24((i // (side // 2)) % (side // 2)) + u24(0) + u24(0)
                      + u24(10) + b"\x00" + frame)
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def truncated_progressive_input(rng: random.Random) -> tuple[bytes, str, str]:
    """A progressive JPEG of 5-10 MP cut off at 40-70 % of its length (no EOI marker): a decoder works through
    every scan it has before finding out. A clean 4xx, ``failed``, or — for a decoder that renders what it
    received — ``ready``; never non-terminal."""
    width, height = rng.randint(2400, 3200), rng.randint(2200, 3000)
    image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    for _ in range(24):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        draw.ellipse((x0, y0, x0 + rng.randrange(50, 800), y0 + rng.randrange(50, 800)),
                     fill=tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=75, progressive=True)
    full = out.getvalue()
    return full[:int(len(full) * rng.uniform(0.4, 0.7))], "jpeg", FORMATS["jpeg"][1]


def polyglot_input(rng: random.Random) -> tuple[bytes, str, str]:
    """A valid small image whose bytes are also something else: a JPEG with a ZIP archive appended (a valid ZIP
    too: its directory is found from the end), or a PNG with an HTML page (script included) after IEND. Its magic
    bytes say image; it may be refused (4xx), end ``failed``, or render ``ready`` — if ``ready``, its recorded
    type must be the image's."""
    if rng.random() < 0.5:
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr(zipfile.ZipInfo("index.html", (2020, 1, 1, 0, 0, 0)),
                        f"<html><script>alert({rng.getrandbits(16)})</script></html>")
        return generate_image(rng, "jpeg") + archive.getvalue(), "jpeg", FORMATS["jpeg"][1]
    page = f"<!doctype html><html><body><script>fetch('/x?{rng.getrandbits(32):08x}')</script></body></html>\n"
    return generate_image(rng, "png") + page.encode(), "png", FORMATS["png"][1]


def mislabeled_input(rng: random.Random) -> tuple[bytes, str, str, str]:
    """A good image whose filename extension and claimed content type name another format: (bytes, real format,
    claimed extension, claimed content type). The type comes from magic bytes (CONTRACT §3), so it must be
    accepted and end ``ready``, with the original's content type that of its bytes."""
    real, claimed = rng.sample(sorted(FORMATS), 2)
    return generate_image(rng, real), real, claimed, FORMATS[claimed][1]


def _with_hostile(ops: list[UploadOp], rng: random.Random, kinds: list[str]) -> list[UploadOp]:
    """Spread the hostile ``kinds`` evenly through upload order (their bytes from a stream of their own)."""
    unknown = [k for k in kinds if k not in HOSTILE_KINDS]
    if unknown:
        raise ValueError(f"unknown hostile kinds {unknown}; known: {list(HOSTILE_KINDS)}")
    total = len(ops) + len(kinds)
    at = {min(total - 1, int((k + 0.5) * total / len(kinds))): kind for k, kind in enumerate(kinds)}
    mixed, rest = [], iter(ops)
    webp_first = rng.random() < 0.5  # frame bombs alternate GIF / WebP: a plan with two has one of each
    for index in range(total):
        kind = at.get(index)
        if kind is None:
            mixed.append(dataclasses.replace(next(rest), op=f"u{index:04d}"))
            continue
        if kind == "mislabeled":
            data, fmt, extension, content_type = mislabeled_input(rng)
        elif kind == "frame_bomb":
            data, fmt, content_type = frame_bomb_input(rng, webp=webp_first)
            extension, webp_first = fmt, not webp_first
        else:
            data, fmt, content_type = {"bomb": bomb_input, "huge_dims": huge_dims_input, "polyglot": polyglot_input,
                                       "truncated_progressive": truncated_progressive_input}[kind](rng)
            extension = fmt
        stem = f"{rng.choice(['upload', 'image', 'attachment', 'file'])}-{rng.getrandbits(32):08x}"
        mixed.append(UploadOp(op=f"u{index:04d}", kind=kind, fmt=fmt, filename=f"{stem}.{extension}",
                              content_type=content_type, data=data, idempotency_key=seeded_uuid(rng)))
    return mixed


def fingerprint(ops: list[UploadOp]) -> str:
    """One hash over the whole workload: equal for equal seeds."""
    h = hashlib.sha256()
    for op in ops:
        h.update(f"{op.op}|{op.kind}|{op.filename}|{op.idempotency_key}|{op.sha256}\n".encode())
    return h.hexdigest()


class Uploader:
    """Runs upload ops against the API and records invoke → ok / fail / info.

    A timeout, a dropped connection or a 5xx leaves the outcome unknown (info);
    the client then retries with the same Idempotency-Key, as a careful client
    would — which also turns an unknown outcome into a known acceptance.
    """

    def __init__(self, client, history, retries: int = 4, retry_delay: float = 0.5, timeout: float = 10.0,
                 path: str = "/v1/attachments"):
        self.client = client
        self.path = path  # the adapter's [paths] upload
        self.history = history
        self.retries = retries
        self.retry_delay = retry_delay
        self.timeout = timeout

    def upload(self, op: UploadOp, on_accepted=None) -> dict | None:
        return self._post(op, op.data, "upload", op.op, on_accepted, kind=op.kind, sample=op.op, filename=op.filename,
                          format=op.fmt, size=len(op.data), sha256=op.sha256, idempotency_key=op.idempotency_key)

    def probe(self, op: UploadOp, probe: str, data: bytes, on_accepted=None) -> dict | None:
        """One idempotency probe of ``op`` (its key, ``data`` as the body), retried like an upload on an unknown
        outcome. History: invoke / ok / fail / info with ``f = "idempotency"``."""
        return self._post(op, data, "idempotency", f"{op.op}.{probe}", on_accepted, probe=probe, of=op.op,
                          kind=op.kind, filename=op.filename, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                          same_bytes=data == op.data, idempotency_key=op.idempotency_key)

    def _post(self, op: UploadOp, data: bytes, f: str, op_id: str, on_accepted, **invoked) -> dict | None:
        """POST ``data`` under ``op``'s name and Idempotency-Key; an unknown outcome (connection error, timeout,
        5xx) is retried with the same key, a 4xx is final. The 202 body, or None."""
        for attempt in range(1, self.retries + 2):
            this_id = op_id if attempt == 1 else f"{op_id}.r{attempt - 1}"
            if f == "upload":
                invoked["retry_of"] = op.op if attempt > 1 else None
            self.history.append("invoke", op=this_id, f=f, **invoked)
            try:
                response = self.client.post(
                    self.path, files={"file": (op.filename, data, op.content_type)},
                    headers={"Idempotency-Key": op.idempotency_key}, timeout=self.timeout)
            except Exception as exc:  # connection refused/reset, timeout: we cannot know if it was accepted
                self.history.append("info", op=this_id, f=f, error=type(exc).__name__, detail=str(exc)[:200])
                time.sleep(self.retry_delay * attempt)
                continue
            body = _json(response)
            if response.status_code == 202 and isinstance(body, dict) and body.get("attachment_id"):
                self.history.append("ok", op=this_id, f=f, status=202, attachment_id=body["attachment_id"],
                                    job_id=body.get("job_id"))
                if on_accepted:
                    on_accepted(body["attachment_id"])
                return body
            code = (body or {}).get("error", {}).get("code") if isinstance(body, dict) else None
            if response.status_code >= 500:
                self.history.append("info", op=this_id, f=f, status=response.status_code, error_code=code)
                time.sleep(self.retry_delay * attempt)
                continue
            self.history.append("fail", op=this_id, f=f, status=response.status_code, error_code=code)
            return None
        return None


def idempotency_probes(uploader: "Uploader", ops: list[UploadOp], seed: int, repeats: int = 0, conflicts: int = 0,
                       on_accepted=None) -> None:
    """After the workload (every original answered): send ``repeats`` good uploads again with their own
    Idempotency-Key and the same bytes (CONTRACT §3: the same attachment_id and job_id), and ``conflicts`` good
    uploads' keys with other bytes (a fresh image: refused with 409). Which uploads, and the other bytes, come from
    the seed. Recorded as ``f = "idempotency"`` operations (``probe`` repeat / conflict, ``of`` the original op);
    checkers/upload_idempotency.py judges them."""
    good = [op for op in ops if op.kind == "good"]
    if not good or not (repeats or conflicts):
        return
    rng = stream(seed, "workload-idempotency")
    chosen = rng.sample(good, min(len(good), repeats + conflicts))
    for index, op in enumerate(chosen):
        if index < repeats:
            uploader.probe(op, "repeat", op.data, on_accepted=on_accepted)
        else:
            fmt = rng.choice(sorted(FORMATS))
            other = generate_image(rng, fmt)
            uploader.probe(op, "conflict", other, on_accepted=on_accepted)


def _json(response):
    try:
        return response.json()
    except ValueError:
        return None
