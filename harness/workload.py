"""The seeded workload: a corpus of generated images plus bad inputs, and the upload client.

The same seed yields byte-identical files, names and Idempotency-Keys, so a
failing run can be replayed exactly (`harness run SCENARIO --seed N`).
"""

from __future__ import annotations

import hashlib
import io
import random
import time
from dataclasses import dataclass

from PIL import Image, ImageDraw

from .seeding import seeded_uuid, stream

FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg"), "webp": ("WEBP", "image/webp"),
           "gif": ("GIF", "image/gif")}


@dataclass(frozen=True)
class UploadOp:
    op: str
    kind: str  # good | bad (rejected or failed) | poison (accepted by type sniffing, fails decoding)
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


POSITIONS = ("first", "middle", "last")


def plan(seed: int, uploads: int, bad: int = 0, poison: int = 0, max_side: int = 96,
         poison_at: tuple[str, ...] | list[str] = (), min_side: int = 16) -> list[UploadOp]:
    """The deterministic list of uploads for ``seed``, shuffled so bad inputs sit among good ones.

    ``poison_at`` (``first`` / ``middle`` / ``last``) pins that many of the ``poison`` items to those positions of
    upload order (batch independence: the failing item leads, sits inside or closes a batch); the rest shuffle.
    ``min_side`` makes every good image at least that large (work whose processing time is predictable)."""
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
    return ops


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

    def __init__(self, client, history, retries: int = 4, retry_delay: float = 0.5, timeout: float = 10.0):
        self.client = client
        self.history = history
        self.retries = retries
        self.retry_delay = retry_delay
        self.timeout = timeout

    def upload(self, op: UploadOp, on_accepted=None) -> dict | None:
        for attempt in range(1, self.retries + 2):
            op_id = op.op if attempt == 1 else f"{op.op}.r{attempt - 1}"
            self.history.append("invoke", op=op_id, f="upload", kind=op.kind, sample=op.op, filename=op.filename,
                                format=op.fmt, size=len(op.data), sha256=op.sha256,
                                idempotency_key=op.idempotency_key, retry_of=op.op if attempt > 1 else None)
            try:
                response = self.client.post(
                    "/v1/attachments", files={"file": (op.filename, op.data, op.content_type)},
                    headers={"Idempotency-Key": op.idempotency_key}, timeout=self.timeout)
            except Exception as exc:  # connection refused/reset, timeout: we cannot know if it was accepted
                self.history.append("info", op=op_id, f="upload", error=type(exc).__name__, detail=str(exc)[:200])
                time.sleep(self.retry_delay * attempt)
                continue
            body = _json(response)
            if response.status_code == 202 and isinstance(body, dict) and body.get("attachment_id"):
                self.history.append("ok", op=op_id, f="upload", status=202, attachment_id=body["attachment_id"],
                                    job_id=body.get("job_id"))
                if on_accepted:
                    on_accepted(body["attachment_id"])
                return body
            code = (body or {}).get("error", {}).get("code") if isinstance(body, dict) else None
            if response.status_code >= 500:
                self.history.append("info", op=op_id, f="upload", status=response.status_code, error_code=code)
                time.sleep(self.retry_delay * attempt)
                continue
            self.history.append("fail", op=op_id, f="upload", status=response.status_code, error_code=code)
            return None
        return None


def _json(response):
    try:
        return response.json()
    except ValueError:
        return None
