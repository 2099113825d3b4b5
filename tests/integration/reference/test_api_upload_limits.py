"""Issue 10, defect 12: uploads are bounded per process, not only per request.

1. More concurrent uploads than MAX_CONCURRENT_UPLOADS: the excess is answered 503 with Retry-After (before its
   body is read), never another status; every accepted upload ends ready, and the refused ones are accepted
   when retried with the same Idempotency-Key.
2. Slow-to-decode JPEGs (a progressive JPEG of thousands of empty scans, bytes after its EOI so the API takes
   its decoding slow path): the decode runs isolated with a time limit, so /healthz and a good upload are
   answered within a bound while they are in flight, and each hostile upload gets a 4xx (or a 503 while every
   sandbox process is busy) instead of pinning an API thread for tens of seconds.

The cap is the reference's own (the contract does not oblige one), and responsiveness under hostile input is
not a contract verdict either: hence an integration test on real services, not a harness scenario.

RED on the unfixed reference: ``REFERENCE_UNDER_TEST=/work/base .venv/bin/pytest <this file>`` (see
``reference_support.roles_from``).
"""

from __future__ import annotations

import struct
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from reference_support import assert_event_path, roles_from, sample_jpeg

pytestmark = pytest.mark.integration



def assert_ready(pipeline, attachment_id: str, timeout: float) -> None:
    """Ready with every promised variant, by legal transitions (the object layout is not this test's concern)."""
    status = pipeline.wait_state(attachment_id, timeout=timeout)
    assert sorted(v["name"] for v in status["variants"]) == ["crop", "optimized", "thumbnail"], status
    assert_event_path(pipeline.events(attachment_id))

def _entropy_bytes(bits: str) -> bytes:
    bits += "1" * (-len(bits) % 8)
    out = bytearray()
    for i in range(0, len(bits), 8):
        out.append(int(bits[i:i + 8], 2))
        if out[-1] == 0xFF:
            out.append(0)  # byte stuffing
    return bytes(out)


def slow_progressive_jpeg(side: int = 4096, scans: int = 10_000, trailer: bytes = b"junk") -> bytes:
    """A valid grayscale progressive JPEG whose every AC scan is one run of empty blocks: tiny on the wire, yet a
    decoder walks all ``(side/8)^2`` blocks once per scan (about 3.5 ms per scan at 4096 px here, so ~35 s).
    ``trailer`` after the EOI makes an API that checks trailers take its decoding path."""
    def segment(marker: int, payload: bytes) -> bytes:
        return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload

    out = bytearray(b"\xff\xd8")
    out += segment(0xDB, b"\x00" + b"\x01" * 64)
    out += segment(0xC2, struct.pack(">BHHB", 8, side, side, 1) + b"\x01\x11\x00")
    out += segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00")  # DC: code 0 -> difference 0
    out += segment(0xC4, b"\x10" + bytes([1] + [0] * 15) + b"\xe0")  # AC: code 0 -> EOB run of 2^14 + 14 bits
    blocks = (side // 8) ** 2
    out += segment(0xDA, b"\x01\x01\x00\x00\x00\x00") + _entropy_bytes("0" * blocks)
    ac_scan = segment(0xDA, b"\x01\x01\x00\x01\x3f\x00") + _entropy_bytes(("0" + "1" * 14) * -(-blocks // 32767))
    out += ac_scan * scans
    return bytes(out) + b"\xff\xd9" + trailer


def multipart(data: bytes, filename: str) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def upload(url: str, data: bytes, key: str, timeout: float = 60, trickle_seconds: float = 0.0) -> httpx.Response:
    """POST /v1/attachments on a client of its own; ``trickle_seconds`` sends the body slowly (chunked)."""
    body, content_type = multipart(data, f"{key}.jpg")
    headers = {"Content-Type": content_type, "Idempotency-Key": key}
    if trickle_seconds:
        pieces = 10
        step = -(-len(body) // pieces)

        def chunks():
            for i in range(pieces):
                yield body[i * step:(i + 1) * step]
                time.sleep(trickle_seconds / pieces)

        content = chunks()
    else:
        content = body
    with httpx.Client(timeout=timeout) as client:
        return client.post(url + "/v1/attachments", content=content, headers=headers)


@pytest.mark.timeout(180)
def test_uploads_beyond_the_cap_get_503_with_retry_after_and_none_is_lost(pipeline, monkeypatch):
    roles_from(pipeline, monkeypatch)
    pipeline.start_all(api={"MAX_CONCURRENT_UPLOADS": "2"})
    url = pipeline.api_url
    holders = [(sample_jpeg(10 + i), f"holder-{i}") for i in range(2)]
    excess = [(sample_jpeg(20 + i), f"excess-{i}") for i in range(4)]

    with ThreadPoolExecutor(len(holders) + len(excess)) as pool:
        # Two slow uploads hold the two slots for ~3 s ...
        held = [pool.submit(upload, url, data, key, trickle_seconds=3.0) for data, key in holders]
        time.sleep(1.0)
        # ... while four more arrive at once.
        started = time.monotonic()
        answers = list(pool.map(lambda item: upload(url, *item, timeout=20), excess))
        excess_seconds = time.monotonic() - started
        health = httpx.get(url + "/healthz", timeout=5)
        held = [future.result() for future in held]

    assert health.status_code == 200
    assert [a.status_code for a in held] == [202, 202], [a.text for a in held]
    assert [a.status_code for a in answers] == [503] * len(excess), [(a.status_code, a.text) for a in answers]
    for answer in answers:
        assert answer.json()["error"]["code"] == "too_many_uploads"
        assert int(answer.headers["Retry-After"]) >= 1
    assert excess_seconds < 2.0, f"the excess was answered only after {excess_seconds:.1f}s"

    # The refused uploads were not accepted: a retry with the same key after Retry-After accepts each once.
    time.sleep(int(answers[0].headers["Retry-After"]))
    retried = [upload(url, data, key) for data, key in excess]
    assert [a.status_code for a in retried] == [202] * len(excess), [a.text for a in retried]
    accepted = [a.json()["attachment_id"] for a in held + retried]
    assert len(set(accepted)) == len(holders) + len(excess)
    for attachment_id in accepted:  # no accepted upload lost
        assert_ready(pipeline, attachment_id, timeout=60)
    rows = pipeline.sql("SELECT count(*) AS n FROM attachments")
    assert rows[0]["n"] == len(accepted)


@pytest.mark.timeout(180)
def test_slow_to_decode_jpegs_do_not_pin_the_api(pipeline, monkeypatch):
    roles_from(pipeline, monkeypatch)
    pipeline.start_all(api={"UPLOAD_DECODE_TIMEOUT_SECONDS": "2", "UPLOAD_DECODE_WORKERS": "1"})
    url = pipeline.api_url
    hostile = slow_progressive_jpeg()
    hostile_count = 8  # more than the default thread pool of a 2-core machine (cores + 4)

    answers: dict[int, tuple[int, float, httpx.Response | None]] = {}
    begun = time.monotonic()

    def send_hostile(index: int) -> None:
        try:
            response = upload(url, hostile, f"hostile-{index}", timeout=90)
            answers[index] = (response.status_code, time.monotonic() - begun, response)
        except httpx.HTTPError as exc:
            answers[index] = (0, time.monotonic() - begun, None)
            print(f"hostile {index}: {type(exc).__name__}")

    threads = [threading.Thread(target=send_hostile, args=(i,), daemon=True) for i in range(hostile_count)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # every hostile upload is being checked now

    started = time.monotonic()
    health = httpx.get(url + "/healthz", timeout=10)
    health_seconds = time.monotonic() - started
    started = time.monotonic()
    try:
        good = upload(url, sample_jpeg(7), "good-during-attack", timeout=10)
    except httpx.TimeoutException:
        good = None
    good_seconds = time.monotonic() - started
    print(f"during the attack: /healthz {health.status_code} in {health_seconds:.2f}s {health.text}; "
          f"good upload {good.status_code if good else 'timed out'} in {good_seconds:.2f}s")

    assert good is not None and good.status_code == 202 and good_seconds < 5.0, \
        f"a good upload was not accepted within 5 s while hostile JPEGs were checked ({good_seconds:.1f}s)"
    assert health.status_code == 200 and health_seconds < 3.0, (health.status_code, health_seconds)
    assert health.json()["storage"] == "ok", health.json()  # its S3 ping found an API thread free

    for thread in threads:
        thread.join(30)
    assert len(answers) == hostile_count, f"hostile uploads still unanswered after 30 s: {sorted(answers)}"
    statuses = sorted(status for status, _, _ in answers.values())
    assert set(statuses) <= {422, 503}, statuses
    assert 422 in statuses
    for status, _, response in answers.values():
        code = response.json()["error"]["code"]
        if status == 422:
            assert code == "decode_timeout", response.text
        else:
            assert code == "decoder_busy" and int(response.headers["Retry-After"]) >= 1, response.text
    assert max(seconds for _, seconds, _ in answers.values()) < 20.0, answers

    assert_ready(pipeline, good.json()["attachment_id"], timeout=60)
    assert pipeline.roles["api"].alive()
    # The killed checks left the sandbox usable: a truncated-looking but sound JPEG still takes the slow path.
    sound = upload(url, sample_jpeg(8) + b"junk", "sound-slow-path", timeout=30)
    assert sound.status_code == 202, sound.text


def _stalled_upload(api_url: str, results: list, index: int) -> None:
    """A sender that announces a 1 MiB body, sends its first bytes, then sends nothing more (a slow client, a
    slowloris): what it gets back, if anything, before its socket gives up, is appended to ``results``."""
    import socket
    from urllib.parse import urlsplit

    host, port = urlsplit(api_url).hostname, urlsplit(api_url).port
    boundary = "stall"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jpg\"\r\n"
            f"Content-Type: image/jpeg\r\n\r\n").encode() + sample_jpeg(index)[:2048]
    request = (f"POST /v1/attachments HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
               f"Content-Length: {1024 * 1024}\r\n\r\n").encode() + head
    started = time.monotonic()
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(request)
        try:
            answer = sock.recv(4096)
        except (socket.timeout, OSError) as exc:
            answer = f"no answer: {type(exc).__name__}".encode()
    results.append((index, round(time.monotonic() - started, 1), answer.split(b"\r\n", 1)[0].decode(errors="replace")))


def test_stalled_senders_get_408_and_free_their_upload_slot(pipeline):
    """Issue 23 defect 10: receiving a body has a deadline (UPLOAD_RECEIVE_TIMEOUT_SECONDS, and no byte for
    UPLOAD_IDLE_TIMEOUT_SECONDS): senders that stall are answered 408 and their upload slots are free again, so
    MAX_CONCURRENT_UPLOADS stalled clients no longer hold every slot."""
    pipeline.start("api", MAX_CONCURRENT_UPLOADS="2", UPLOAD_RECEIVE_TIMEOUT_SECONDS="6",
                   UPLOAD_IDLE_TIMEOUT_SECONDS="3")
    results: list = []
    senders = [threading.Thread(target=_stalled_upload, args=(pipeline.api_url, results, n)) for n in range(2)]
    for sender in senders:
        sender.start()
    time.sleep(1.0)
    assert pipeline.upload(sample_jpeg(40)).status_code == 503  # both slots held by the stalled senders
    for sender in senders:
        sender.join(70)
    print("stalled senders:", results)
    assert sorted(status for _, _, status in results) == ["HTTP/1.1 408 Request Timeout"] * 2, results
    assert all(seconds <= 15 for _, seconds, _ in results), results
    accepted = pipeline.upload(sample_jpeg(41))
    assert accepted.status_code == 202, accepted.text
