"""Streaming receipt of ``multipart/form-data`` uploads.

The body is parsed as it arrives, so the limits act early: the byte cap
answers 413 as soon as it is crossed (or at once from Content-Length), the
type is sniffed from the first bytes (415 without reading the rest), and the
SHA-256 is computed while the bytes are spooled to a temporary file (memory
first, disk past 1 MiB). Only the field ``file`` is kept; other fields are
counted against the cap and dropped.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from python_multipart.multipart import MultipartParseError, MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks  # a TypedDict of its stubs only

from reference.inspection import SNIFF_BYTES, UploadRejected, could_still_match, sniff

FILE_FIELD = "file"
MULTIPART_OVERHEAD = 64 * 1024  # boundaries, part headers and small fields besides the file
TAIL_BYTES = 1024
SPOOL_IN_MEMORY = 1024 * 1024


@dataclass
class ReceivedFile:
    spool: tempfile.SpooledTemporaryFile[bytes]
    size: int
    sha256: str
    kind: str
    head: bytes
    tail: bytes
    filename: str | None

    def close(self) -> None:
        self.spool.close()


@dataclass
class _FileSink:
    max_bytes: int
    spool: tempfile.SpooledTemporaryFile[bytes] = field(
        default_factory=lambda: tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY))
    digest: "hashlib._Hash" = field(default_factory=hashlib.sha256)
    size: int = 0
    head: bytes = b""
    tail: bytes = b""
    kind: str | None = None

    def write(self, data: bytes) -> None:
        if not data:
            return
        self.size += len(data)
        if self.size > self.max_bytes:
            raise UploadRejected(413, "too_large", f"the file exceeds {self.max_bytes} bytes")
        if len(self.head) < SNIFF_BYTES:
            self.head += data[: SNIFF_BYTES - len(self.head)]
            if not could_still_match(self.head):
                raise UploadRejected(415, "unsupported_media_type", "only JPEG, PNG, WebP and GIF images are accepted")
            if len(self.head) >= SNIFF_BYTES:
                self.kind = sniff(self.head)
                if self.kind is None:
                    raise UploadRejected(415, "unsupported_media_type",
                                         "only JPEG, PNG, WebP and GIF images are accepted")
        self.digest.update(data)
        self.spool.write(data)
        self.tail = (self.tail + data)[-TAIL_BYTES:]


class _Parts:
    """python-multipart callbacks that route the ``file`` part to a sink."""

    def __init__(self, sink: _FileSink, max_header_bytes: int = 16 * 1024):
        self.sink = sink
        self.header_field = b""
        self.header_value = b""
        self.headers: dict[bytes, bytes] = {}
        self.header_bytes = 0
        self.max_header_bytes = max_header_bytes
        self.in_file = False
        self.seen_file = False
        self.file_done = False
        self.filename: str | None = None

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
        }

    def on_part_begin(self) -> None:
        self.headers, self.header_field, self.header_value, self.in_file = {}, b"", b"", False

    def _count_header(self, n: int) -> None:
        self.header_bytes += n
        if self.header_bytes > self.max_header_bytes:
            raise UploadRejected(400, "invalid_multipart", "part headers too large")

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.headers[self.header_field.strip().lower()] = self.header_value.strip()
        self.header_field, self.header_value = b"", b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if name == FILE_FIELD and not self.seen_file:
            self.in_file = self.seen_file = True
            raw = options.get(b"filename")
            self.filename = raw.decode("utf-8", "replace") if raw is not None else None

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.in_file:
            self.sink.write(data[start:end])

    def on_part_end(self) -> None:
        if self.in_file:
            self.file_done = True
        self.in_file = False


async def _chunks(request: Request, total_seconds: float | None,
                  idle_seconds: float | None) -> AsyncIterator[bytes]:
    """The body's chunks, each awaited within the idle limit and the whole within the total one (issue 23 defect
    10: a sender that stalls or trickles must not hold an upload slot for ever): 408 on expiry."""
    stream = request.stream().__aiter__()
    loop = asyncio.get_running_loop()
    deadline = None if total_seconds is None else loop.time() + total_seconds
    while True:
        limits = [s for s in (idle_seconds, None if deadline is None else deadline - loop.time()) if s is not None]
        wait = min(limits) if limits else None
        try:
            if wait is not None and wait <= 0:
                raise asyncio.TimeoutError
            chunk = await asyncio.wait_for(stream.__anext__(), wait)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise UploadRejected(408, "request_timeout",
                                 "the request body did not arrive in time (too slow, or stalled)") from None
        yield chunk


async def receive_file(request: Request, max_bytes: int, *, total_seconds: float | None = None,
                       idle_seconds: float | None = None) -> ReceivedFile:
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or b"boundary" not in options:
        raise UploadRejected(400, "invalid_multipart", "expected multipart/form-data with a 'file' field")
    body_cap = max_bytes + MULTIPART_OVERHEAD
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > body_cap:
                raise UploadRejected(413, "too_large", f"the file exceeds {max_bytes} bytes")
        except ValueError:
            raise UploadRejected(400, "invalid_request", "bad Content-Length") from None

    sink = _FileSink(max_bytes)
    parts = _Parts(sink)
    parser = MultipartParser(options[b"boundary"], parts.callbacks())
    received = 0
    try:
        try:
            async for chunk in _chunks(request, total_seconds, idle_seconds):
                received += len(chunk)
                if received > body_cap:
                    raise UploadRejected(413, "too_large", f"the file exceeds {max_bytes} bytes")
                parser.write(chunk)
            parser.finalize()
        except MultipartParseError:
            raise UploadRejected(400, "invalid_multipart", "malformed multipart body") from None
        except ClientDisconnect:
            raise UploadRejected(400, "client_disconnected", "the client went away") from None
        if not parts.seen_file:
            raise UploadRejected(400, "missing_file", "multipart field 'file' is required")
        if not parts.file_done:
            raise UploadRejected(400, "invalid_multipart", "the 'file' part is incomplete")
        if sink.size == 0:
            raise UploadRejected(400, "empty_file", "the file is empty")
        if sink.kind is None:  # fewer bytes than the sniff window
            raise UploadRejected(415, "unsupported_media_type", "only JPEG, PNG, WebP and GIF images are accepted")
    except BaseException:
        sink.spool.close()
        raise
    return ReceivedFile(sink.spool, sink.size, sink.digest.hexdigest(), sink.kind, sink.head, sink.tail,
                        parts.filename)
