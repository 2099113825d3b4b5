"""Issue 9 blind spots of message_hygiene (identity, bytes, credentials in headers and properties),
staging_safety (a final read before the retention ran out; a layout other than ``staging/<id>``) and
upload_idempotency (a repeated Idempotency-Key; a good upload refused with a 4xx)."""

from __future__ import annotations

import base64
import io

from PIL import Image

from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness.checkers import message_hygiene, staging_safety
from harness_histories import ATT, JOB, Builder, happy, iso, job_message, T0

OTHER_JOB = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
OTHER_ATT = "9a1b2c3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d"


def png_b64() -> str:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


# --- message_hygiene: headers and properties ----------------------------------------------------------------------

def test_hygiene_finds_image_bytes_in_a_header():
    b = happy()
    b.add(1, "message", body=job_message(), properties={"headers": {"x-original": png_b64()}})
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and any("bytes" in e["message"] for e in verdict.evidence), verdict.evidence


def test_hygiene_finds_image_bytes_in_the_body_too():
    b = happy()
    b.add(1, "message", body=job_message(preview=png_b64()), properties={})
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and any("bytes" in e["message"] for e in verdict.evidence), verdict.evidence


def test_hygiene_finds_credentials_in_headers_and_properties():
    b = happy()  # credentials are judged by value: a secret the run's roles were given (kept as its hash)
    b.run["storage"] = message_hygiene.storage_record({"S3_SECRET_KEY": "wJalrXUtnFEMI"})
    b.add(1, "message", body=job_message(), properties={"headers": {"x-s3-secret-key": "wJalrXUtnFEMI"}})
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and any("credential" in e["message"] for e in verdict.evidence), verdict.evidence
    b2 = happy()
    b2.add(1, "message", body=job_message(), properties={"headers": {"Authorization": "Bearer abc.def"}})
    assert message_hygiene.check(b2.history(), b2.final, b2.run).status == INVALID


def test_hygiene_a_replay_keeps_the_job_id_of_the_202():
    b = happy()
    b.add(5, "invoke", op="replay-1", f="replay", attachment_id=ATT)
    b.add(5.1, "ok", op="replay-1", f="replay", attachment_id=ATT, status=202, job_id=OTHER_JOB, attempt=2)
    b.add(5.2, "message", body=job_message(job_id=OTHER_JOB, attempt=2), properties={})
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and any("replay" in e["message"] for e in verdict.evidence), verdict.evidence


def test_hygiene_the_202_job_id_names_no_other_attachment():
    b = happy()  # ATT was given JOB by its 202; the only message naming JOB names an attachment never uploaded
    b.events = [e for e in b.events if e["type"] != "message"]
    b.add(1, "message", body=job_message(attachment_id=OTHER_ATT), properties={})
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and any("another attachment" in e["message"] for e in verdict.evidence), \
        verdict.evidence


def test_hygiene_the_202_job_id_must_be_seen_on_a_message_of_its_processed_attachment():
    b = happy()  # ATT processed; its only message named a job the 202 did not give, which a replay later returned
    b.events = [e for e in b.events if e["type"] != "message"]
    b.add(0.15, "message", body=job_message(job_id=OTHER_JOB), properties={})
    b.add(5, "invoke", op="replay-1", f="replay", attachment_id=ATT)
    b.add(5.1, "ok", op="replay-1", f="replay", attachment_id=ATT, status=202, job_id=OTHER_JOB, attempt=2)
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and any("never seen" in e["message"] for e in verdict.evidence), verdict.evidence


def test_hygiene_still_accepts_a_free_message_id_extra_fields_and_traceparent():
    b = happy()
    b.add(1, "message", body=job_message(producer="go-relay", shard=3, sha256="ab" * 32),
          properties={"message_id": "fresh-per-publish", "headers": {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16
                                                                     + "-01", "x-token-count": 3}})
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.evidence


# --- staging_safety: the final read and the layout ---------------------------------------------------------------

def staging_run(orphan_age: float, asked=True, layout=None):
    """One ready attachment, one orphan staged ``orphan_age`` seconds before the final read (retention 5, sweep 1:
    judged after 9 s). ``layout``: (original key, variant key prefix, orphan key) templates over the id."""
    b = happy()
    if asked:
        b.run["scenario"] = {"name": "hand-made", "checks": ["staging_safety"]}
    body = b.attachments[ATT]["body"]
    orphan = "staging/0badc0de-0000-4000-8000-000000000001"
    if layout:
        original, variant, orphan = layout
        old_key = body["original"]["key"]
        body["original"]["key"] = original.format(id=ATT)
        objects = b.attachments[ATT]["objects"]
        objects[body["original"]["key"]] = objects.pop(old_key)
        for v in body["variants"]:
            old = v["key"]
            v["key"] = variant.format(id=ATT, name=v["name"])
            objects[v["key"]] = objects.pop(old)
    read_at = T0 + 1000
    b.final["bucket_objects"] = [{"key": k, "size": 10, "last_modified": iso(T0 + 2)} for k in b.attachments[ATT]["objects"]]
    b.final["bucket_objects"].append({"key": orphan, "size": 55, "last_modified": iso(read_at - orphan_age)})
    b.add(0.5, "invoke", op="u9", f="upload", kind="good", sample="u9", size=99)
    b.add(0.6, "info", op="u9", f="upload", error="RemoteProtocolError")
    return b


def test_staging_a_young_orphan_at_the_final_read_is_not_a_pass():
    b = staging_run(orphan_age=3)  # read 3 s after the orphan was staged: its retention has not run out
    verdict = staging_safety.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "retention" in verdict.summary, verdict.summary
    b2 = staging_run(orphan_age=3, asked=False)  # a scenario not relying on staging cleanup: not exercised there
    verdict = staging_safety.check(b2.history(), b2.final, b2.run)
    assert verdict.status == VALID and "young" in verdict.summary


def test_staging_an_old_orphan_is_still_invalid_and_a_cleaned_one_valid():
    b = staging_run(orphan_age=30)
    assert staging_safety.check(b.history(), b.final, b.run).status == INVALID
    b.final["bucket_objects"] = b.final["bucket_objects"][:-1]
    verdict = staging_safety.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary


def test_staging_layout_comes_from_the_original_key_not_a_staging_prefix():
    # originals at <id>/original, variants at <id>/<name>: no shared first folder, yet an orphan is recognisable
    layout = ("{id}/original", "{id}/{name}", "0badc0de-0000-4000-8000-000000000001/original")
    b = staging_run(orphan_age=30, layout=layout)
    verdict = staging_safety.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "0badc0de" in str(verdict.evidence), verdict.summary
    # a deeper layout: uploads/2026/11/<id>.bin, variants elsewhere
    layout = ("uploads/2026/11/{id}.bin", "out/{id}/{name}", "uploads/2026/11/0badc0de-0000-4000-8000-000000000001.bin")
    b = staging_run(orphan_age=30, layout=layout)
    assert staging_safety.check(b.history(), b.final, b.run).status == INVALID


def test_staging_a_layout_that_cannot_be_told_apart_is_unknown_where_relied_on():
    # originals and variants in one flat folder, named by random ids: staging objects cannot be told apart
    layout = ("objects/5e0f1a2b-aaaa-4bbb-8ccc-000000000001", "objects/{name}-{id}", "objects/0badc0de")
    b = staging_run(orphan_age=30, layout=layout)
    verdict = staging_safety.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "layout" in verdict.summary, verdict.summary


# --- upload_idempotency -------------------------------------------------------------------------------------------

def probe(b, at, kind, answer_type, answer):
    of = "u0"
    b.add(at, "invoke", op=f"{of}.{kind}", f="idempotency", probe=kind, of=of, kind="good",
          idempotency_key="k-1", same_bytes=kind == "repeat")
    b.add(at + 0.05, answer_type, op=f"{of}.{kind}", f="idempotency", **answer)


def idempotency_run(*probes_):
    b = Builder(scenario={"name": "hand-made", "checks": ["upload_idempotency"]})
    b.add(0, "invoke", op="u0", f="upload", kind="good", sample="u0", filename="holiday-0000abcd.png")
    b.add(0.05, "ok", op="u0", f="upload", status=202, attachment_id=ATT, job_id=JOB)
    b.add(0.15, "message", body=job_message(), properties={})
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (2, "processing", "ready", 1, "worker")])
    for args in probes_:
        probe(b, *args)
    return b


def verdicts_of(b):
    from harness.checkers import run_checks
    return {v.invariant: v for v in run_checks(b.history(), b.final, b.run)}


def test_idempotency_a_repeated_key_answered_with_a_new_attachment_is_invalid():
    b = idempotency_run((3, "repeat", "ok", dict(status=202, attachment_id=OTHER_ATT, job_id=OTHER_JOB)))
    found = verdicts_of(b)
    verdict = found["upload_idempotency"]
    assert verdict.status == INVALID and "another attachment" in verdict.evidence[0]["message"], verdict.evidence
    # today's checkers (before upload_idempotency) see nothing wrong in it
    assert all(v.status != INVALID for name, v in found.items() if name != "upload_idempotency"), \
        {n: v.summary for n, v in found.items() if v.status == INVALID}


def test_idempotency_a_repeated_key_refused_or_another_job_id_is_invalid():
    b = idempotency_run((3, "repeat", "fail", dict(status=409, error_code="idempotency_key_reused")))
    assert verdicts_of(b)["upload_idempotency"].status == INVALID
    b = idempotency_run((3, "repeat", "ok", dict(status=202, attachment_id=ATT, job_id=OTHER_JOB)))
    assert "another job_id" in verdicts_of(b)["upload_idempotency"].evidence[0]["message"]


def test_idempotency_the_same_key_with_other_bytes_must_be_refused_with_409():
    b = idempotency_run((3, "conflict", "ok", dict(status=202, attachment_id=ATT, job_id=JOB)))
    verdict = verdicts_of(b)["upload_idempotency"]
    assert verdict.status == INVALID and "does not hold" in verdict.evidence[0]["message"]
    b = idempotency_run((3, "conflict", "fail", dict(status=422, error_code="bad")))
    assert "not 409" in verdicts_of(b)["upload_idempotency"].evidence[0]["message"]


def test_idempotency_a_good_upload_refused_with_a_4xx_counts_against_the_implementation():
    b = idempotency_run()
    b.add(4, "invoke", op="u1", f="upload", kind="good", sample="u1", filename="scan-00000001.png")
    b.add(4.05, "fail", op="u1", f="upload", status=429, error_code="too_many")
    found = verdicts_of(b)
    assert found["upload_idempotency"].status == INVALID
    assert "refused with a 4xx" in found["upload_idempotency"].evidence[0]["message"]
    assert found["lost_accepted_work"].status == VALID  # today's checker: a refused upload was never accepted


def test_idempotency_valid_for_the_contract_answers_and_unknown_when_nothing_was_probed():
    b = idempotency_run((3, "repeat", "ok", dict(status=202, attachment_id=ATT, job_id=JOB)),
                        (4, "conflict", "fail", dict(status=409, error_code="idempotency_key_reused")))
    b.add(5, "invoke", op="u2", f="upload", kind="bad", sample="u2", filename="scan-00000002.png")
    b.add(5.05, "fail", op="u2", f="upload", status=415, error_code="unsupported")  # bad input: a 4xx is right
    verdict = verdicts_of(b)["upload_idempotency"]
    assert verdict.status == VALID and verdict.exercised, verdict.evidence
    b = idempotency_run()
    verdict = verdicts_of(b)["upload_idempotency"]
    assert verdict.status == UNKNOWN and "idempotency not proven" in verdict.summary
    b = idempotency_run((3, "repeat", "info", dict(error="ReadTimeout")))  # unknown outcome: noted, not judged
    assert verdicts_of(b)["upload_idempotency"].status == UNKNOWN
