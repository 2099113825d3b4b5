"""Version isolation (level 5, CONTRACT §5 "a concurrent attempt never overwrites a newer pipeline_version"; the seed:
"Конкурентные попытки не перезаписывают более новый pipeline_version").

Read from the contract's level-5 surface only (docs/CONTRACT.md): the ``versions[]`` list of
``GET /v1/attachments/{id}`` (each version's state and the keys and checksums of its variants), the operator's
reprocess calls the harness itself made, the objects as the store held them when each version was first seen ready,
and the final read. Per (attachment, pipeline_version):

* once ``ready``, the version stays ``ready`` with the same variants (names, keys, checksums) — no older or newer
  attempt replaces it, and the objects it names are not rewritten afterwards (HEAD when first seen ready vs the
  final read: existence, ETag, size, Last-Modified);
* at most one ``processing → ready`` per version (when the events say which version took a transition);
* the attachment as GET serves it stays ``ready`` once it was (``ready`` of an older version stays readable while a
  newer one works, and after a rollback);
* a reprocess is refused without the operator token, and asking twice gives the same job (idempotent);
* a version asked for ends terminal while its consumers run (a rollback — its consumers stopped — may leave it
  queued, never lost from ``versions[]``).

Nothing of an implementation's wording, key layout or tables is assumed.
"""

from __future__ import annotations

from typing import Any

from ..history import Event, History
from .base import INVALID, UNKNOWN, VALID, Verdict, evidence, final_events, not_proven, seed_of, FinalState, RunInfo

NAME = "version_isolation"
REQUIREMENTS = ["BE-JOB-002"]
TERMINAL = ("ready", "failed")


def _variants_sig(variants: list[dict[str, Any]] | None) -> tuple[tuple[str, str, str], ...]:
    return tuple(sorted((str(v.get("name")), str(v.get("key")), str(v.get("sha256"))) for v in variants or []))


def _final_versions(final: FinalState) -> dict[Any, list[dict[str, Any]]]:
    """attachment id -> its versions[] at the final read."""
    out: dict[Any, list[dict[str, Any]]] = {}
    for attachment_id, record in ((final or {}).get("attachments") or {}).items():
        body = record.get("body") or {}
        if isinstance(body.get("versions"), list):
            out[attachment_id] = body["versions"]
    return out


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    asked = [e for e in history.of_type("ok", "fail") if e.get("f") == "reprocess"]
    seen = history.of_type("versions")
    finals = _final_versions(final)
    multi = [e for e in seen if len({v.get("pipeline_version") for v in e.get("versions") or []}) > 1]
    multi_final = [a for a, vs in finals.items() if len({v.get("pipeline_version") for v in vs}) > 1]
    if not asked and not multi and not multi_final:
        return not_proven(NAME, REQUIREMENTS, "version isolation",
                          "no attachment was reprocessed for another pipeline version", run, [])
    if asked and not seen and not finals:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                       f"{len(asked)} reprocess calls made, but GET shows no versions[] (docs/CONTRACT.md level 5): "
                       "which versions exist and what each published cannot be observed", seed=seed_of(run))
    problems: list[dict[str, Any]] = []
    proven: list[dict[str, Any]] = []
    stopped: set[Any] = {e.get("pipeline_version") for e in history.of_type("fault") if e.get("action") == "stop_version"}

    # The operator call: refused without a token, idempotent when repeated.
    for r in asked:
        base: dict[str, Any] = dict(attachment_id=r.get("attachment_id"), events=[r])
        if r.get("unauthenticated_status") not in (401, 403):
            problems.append(evidence(f"reprocess without a token answered {r.get('unauthenticated_status')}, "
                                     "not 401/403", **base))
        if r["type"] != "ok":
            problems.append(evidence(f"reprocess for version {r.get('pipeline_version')} answered "
                                     f"{r.get('status')}, not 202/200", **base))
            continue
        if r.get("repeat_status") not in (200, 202) or (r.get("repeat_job_id") and r.get("job_id")
                                                          and r["repeat_job_id"] != r["job_id"]):
            problems.append(evidence("reprocess asked twice is not idempotent: second answer "
                                     f"{r.get('repeat_status')} job {r.get('repeat_job_id')} vs {r.get('job_id')}",
                                     **base))

    # Each version once ready stays ready with the same result; the served attachment never leaves ready.
    first_ready: dict[tuple[Any, Any], tuple[Any, ...]] = {}  # (attachment, version) -> (signature, line)
    served_ready: dict[Any, dict[str, Any]] = {}
    observations: list[tuple[Event | None, Any, Any, Any]] = [
        (e, e.get("attachment_id"), e.get("versions") or [], e.get("served_state")) for e in seen]
    observations += [(None, a, [{"pipeline_version": v.get("pipeline_version"), "state": v.get("state"),
                                 "variants": v.get("variants")} for v in vs],
                      ((final.get("attachments") or {}).get(a, {}).get("body") or {}).get("state"))
                     for a, vs in finals.items()]
    for line, attachment_id, versions, served_state in observations:
        where = "at the final read" if line is None else "in GET"
        if served_state == "ready":
            served_ready.setdefault(attachment_id, line or {})
        elif attachment_id in served_ready and served_state is not None:
            problems.append(evidence(f"GET served {served_state!r} {where} after it had served ready: the ready "
                                     "version stopped being readable while another version worked",
                                     attachment_id=attachment_id, events=[served_ready[attachment_id], line]))
        listed = {v.get("pipeline_version"): v for v in versions}
        for (aid, version), (signature, first) in list(first_ready.items()):
            if aid != attachment_id:
                continue
            now = listed.get(version)
            if now is None:
                problems.append(evidence(f"version {version} was ready, then missing from versions[] {where}",
                                         attachment_id=aid, events=[first, line]))
            elif now.get("state") != "ready":
                problems.append(evidence(f"version {version} went ready -> {now.get('state')} {where}",
                                         attachment_id=aid, events=[first, line]))
            elif _variants_sig(now.get("variants")) != signature:
                problems.append(evidence(f"version {version}'s ready result changed {where} (other keys or "
                                         "checksums): an attempt overwrote a published version",
                                         attachment_id=aid, events=[first, line],
                                         before=list(signature), after=list(_variants_sig(now.get("variants")))))
        for version, v in listed.items():
            if v.get("state") == "ready" and (attachment_id, version) not in first_ready:
                first_ready[(attachment_id, version)] = (_variants_sig(v.get("variants")), line or {})

    # The objects a ready version named were not rewritten after it was first seen ready.
    objects_final = {a: (r.get("objects") or {}) for a, r in ((final or {}).get("attachments") or {}).items()}
    snapshots = history.of_type("version_snapshot")
    for snap in snapshots:
        if not snap.get("exists"):
            continue
        attachment_id, version, key = snap.get("attachment_id"), snap.get("pipeline_version"), snap.get("key")
        now = objects_final.get(attachment_id, {}).get(key)
        if now is None:
            continue  # not read at the end (the version left versions[]: reported above)
        newer = sorted(v for (a, v) in first_ready if a == attachment_id and v != version)
        if not now.get("exists"):
            problems.append(evidence(f"object {key} of version {version}'s ready result is gone at the final read",
                                     attachment_id=attachment_id, events=[snap], versions=newer))
            continue
        changed = [f for f in ("etag", "size", "last_modified")
                   if snap.get(f) is not None and now.get(f) is not None and snap.get(f) != now.get(f)]
        if changed:
            problems.append(evidence(
                f"object {key} of version {version} was rewritten after the version was ready "
                f"({', '.join(changed)} changed): an attempt of another pipeline version wrote over it",
                attachment_id=attachment_id, events=[snap], other_versions=newer,
                before={f: snap.get(f) for f in changed}, after={f: now.get(f) for f in changed}))
        else:
            proven.append(evidence(f"version {version}: object {key} unchanged since the version was first seen ready",
                                   attachment_id=attachment_id, pipeline_version=version, key=key))

    # One ready per (attachment, version), when the events name the version.
    for attachment_id in finals:
        readies: dict[str, Any] = {}
        for ev in final_events(final, attachment_id):
            if ev.get("to") == "ready" and ev.get("pipeline_version") is not None:
                readies.setdefault(ev["pipeline_version"], []).append(ev.get("seq"))
        for version, seqs in readies.items():
            if len(seqs) > 1:
                problems.append(evidence(f"version {version} reached ready {len(seqs)} times (events {seqs})",
                                         attachment_id=attachment_id))

    # Every version asked for is still listed, and terminal unless its consumers were stopped (a rollback).
    for r in asked:
        if r["type"] != "ok":
            continue
        attachment_id, version = r.get("attachment_id"), r.get("pipeline_version")
        listed = {v.get("pipeline_version"): v for v in finals.get(attachment_id) or []}
        if attachment_id not in finals:
            continue
        if version not in listed:
            problems.append(evidence(f"version {version} was accepted for reprocessing but is not in versions[] "
                                     "at the final read", attachment_id=attachment_id, events=[r]))
        elif version not in stopped and listed[version].get("state") not in TERMINAL:
            problems.append(evidence(f"version {version} is still {listed[version].get('state')!r} at the final "
                                     "read although its consumers ran: the reprocessed work was not done",
                                     attachment_id=attachment_id, events=[r]))

    pairs = len(first_ready)
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} version-isolation violations",
                       evidence=problems[:30], seed=seed_of(run))
    if not snapshots and not first_ready:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "no version was ever seen ready: nothing to isolate",
                       seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{pairs} (attachment, version) results stayed as published; {len(proven)} objects unchanged; "
                   f"{len(asked)} reprocess calls refused without a token and idempotent"
                   + (f"; rollback of version(s) {sorted(stopped)}" if stopped else ""),
                   evidence=proven[:10], seed=seed_of(run))
