"""Invariant 6 — ownership (BE-JOB-006).

When a worker is paused longer than its lease, the job it held is recovered
by someone else while it sleeps (the new owner may finish it after the old one
woke), and once it wakes its stale writes are rejected: no transition by an
older attempt after a newer attempt started, no ``ready`` committed by the owner
of an older claim after a newer claim began (known by the transition's actor,
whatever attempt it carries: ``stale_commits``), and ready stays single (see
duplicate_effects).

The lease the adapter declares (``lease_seconds``) is checked against the implementation's own behaviour: when the
only consumer instance is killed, crashes or is paused while it holds a job, the job can leave ``processing`` (a
recovery) no sooner than a lease after its claim — the claim's lease runs at least that long, renewed or not. A
recovery sooner than the declared lease (less a second of slack) contradicts the claim: the real lease is shorter
than the adapter says (every window the checkers place by it is misplaced), or work was taken over while its lease
still held. Either way ``invalid``, with the measured time (``lease_claim``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from .ack_after_commit import in_flight_at
from ..history import Event, History
from .base import (INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, consumer_roles, evidence, level_of,
                   parse_time, role_kind, seed_of, timing, transitions_of, FinalState, RunInfo)

NAME = "lease_ownership"
REQUIREMENTS = ["BE-JOB-006"]
TIMINGS = ("lease_seconds",)
# Event times have the implementation's own precision and clock (one clock for a claim and its recovery): a
# recovery this much before claim + declared lease is not a rounding.
LEASE_CLAIM_SLACK_SECONDS = 1.0
# A transition stamped this close to the moment the harness took the owner down may be the owner's own last word.
OWNER_LAST_WORD_SECONDS = 0.1
# An object's Last-Modified (S3's clock) against a claim's time (the implementation's database clock): this much
# besides the second Last-Modified truncates.
STALE_RESULT_SLACK_SECONDS = 0.5


def pauses(history: History, consumers: frozenset[str]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(sigstop event, matching sigcont event or None) for pauses of a consumer role."""
    out = []
    stops = [e for e in history.of_type("fault") if e.get("action") == "sigstop" and role_kind(e.get("role")) in consumers]
    conts = [e for e in history.of_type("fault") if e.get("action") == "sigcont"]
    for stop in stops:
        cont = next((c for c in conts if c.get("role") == stop.get("role") and c["seq"] > stop["seq"]), None)
        out.append((stop, cont))
    return out


def owner_downs(history: History, consumers: frozenset[str]) -> list[tuple[dict[str, Any], float | None]]:
    """(the fault that took a consumer instance down, when it could act again: SIGCONT of a pause; None for a kill
    or crash, whose restart is another process) — only while that instance was the only consumer instance started,
    so the job it held was its own."""
    downs: list[tuple[Event, float | None]] = []
    for e in history.of_type("fault"):
        if role_kind(e.get("role")) not in consumers:
            continue
        if (e.get("action"), e.get("phase")) in (("sigkill", "start"), ("crash", "hit")):
            downs.append((e, None))
    for stop, cont in pauses(history, consumers):
        downs.append((stop, cont["wall"] if cont else float("inf")))
    started = [e for e in history.of_type("role") if e.get("action") == "start" and role_kind(e.get("role")) in consumers]
    return [(down, back) for down, back in downs
            if len({e.get("role") for e in started if e["wall"] <= down["wall"]}) <= 1]


def lease_claim(history: History, final: FinalState, run: RunInfo, ids: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(contradictions, measurements) of the declared lease_seconds by recoveries after the owner went down."""
    lease = timing(run, "lease_seconds")
    if lease is None:
        return [], []
    problems, measured = [], []
    for down, back in owner_downs(history, consumer_roles(run)):
        for attachment_id in ids:
            trans = transitions_of(history, final, attachment_id)
            flight = in_flight_at(trans, down["wall"])
            if flight is None or flight["at"] is None:
                continue
            left = next((t for t in trans if (t["seq"] or 0) > (flight["seq"] or 0) and t["at"] is not None), None)
            if (left is None or left["from"] != "processing" or left["to"] not in ("queued", "failed")
                    or left["at"] - down["wall"] < OWNER_LAST_WORD_SECONDS or (back is not None and left["at"] >= back)):
                continue  # not recovered, or perhaps by the owner itself (as it went down, or once it was back)
            after = round(left["at"] - flight["at"], 3)
            item = evidence(f"recovered {after:.2f}s after its claim, its only owner down ({down.get('action')}) "
                            "in between", attachment_id=attachment_id, events=[down], claim_at=flight["at_text"],
                            recovered_at=left["at_text"], transition=f"{left['from']}→{left['to']}",
                            declared_lease_seconds=lease, measured_seconds=after)
            measured.append(item)
            if after < lease - LEASE_CLAIM_SLACK_SECONDS:
                problems.append({**item, "message": (
                    f"the declared lease_seconds {lease:g} does not match the implementation: the job was recovered "
                    f"({left['from']}→{left['to']}) {after:.2f}s after its claim while its only owner was down — "
                    "its lease is shorter than declared, or it was taken over while its lease held")})
    return problems, measured


def stale_commits(trans: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(commit, the stale claim it came from, the newer claim it overrode): a ``ready`` committed after a newer
    claim began, by the owner of an older one. The attempt it carries proves nothing (an implementation may stamp
    the row's current attempt on any write); whose write it is shows in its ``actor``, compared as an identity,
    never by its wording: equal to an older claim's actor and unlike the newest claim's. Only a commit to ``ready``
    is judged this way — a recovery (``processing`` → ``queued``/``failed``) may rightly be written by any
    instance, an old owner too. Actors that do not tell the owners apart (one string for every instance) decide
    nothing here."""
    out, claims = [], []
    for t in trans:
        if t["to"] == "processing":
            claims.append(t)
            continue
        if t["from"] != "processing" or t["to"] != "ready" or len(claims) < 2 or not t.get("actor"):
            continue
        newest = claims[-1]
        if t["actor"] == newest.get("actor"):
            continue
        older = next((c for c in reversed(claims[:-1]) if c.get("actor") == t["actor"]), None)
        if older is not None:
            out.append((t, older, newest))
    return out


def _named_versions(history: History, record: dict[str, Any], attachment_id: str) -> list[tuple[str, float, dict[str, Any]]]:
    """(key, Last-Modified, the line it came from) of each object the attachment's ``ready`` names, as it stood when
    ready was first seen (the ready snapshot's HEAD), else as the final read found it."""
    out = []
    body = record.get("body") or {}
    snaps = {}
    for e in history.of_type("snapshot"):
        if e.get("attachment_id") == attachment_id and e.get("exists") and e.get("key") not in snaps:
            snaps[e.get("key")] = e
    for variant in body.get("variants") or []:
        key = variant.get("key")
        seen = snaps.get(key) or ((record.get("objects") or {}).get(key) or {})
        landed = parse_time(seen.get("last_modified"))
        if key and landed is not None:
            out.append((key, landed, seen))
    return out


def stale_results(history: History, record: dict[str, Any], attachment_id: str, trans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fencing judged from the effects the harness sees itself, not from the event log: the objects ``ready`` names
    must be the committing claim's. When a job was claimed more than once before its ``ready``, the claim that
    committed is the newest (a fenced commit is refused to every older one), and a new claim writes its variants
    again (CONTRACT §6: to the same keys or to keys of its own). So an object ``ready`` names whose bytes landed
    (Last-Modified, whole seconds, S3's clock) surely before the newest claim began, and after the first claim began,
    was written by an older claim: the published result is a stale owner's, whatever actor and attempt its event
    carries (an event written from the row as it stands — a trigger — names the current owner on a stale commit)."""
    if (record.get("body") or {}).get("state") != "ready":
        return []
    ready = next((t for t in trans if t["from"] == "processing" and t["to"] == "ready" and t["at"] is not None), None)
    if ready is None:
        return []
    claims = [t for t in trans if t["to"] == "processing" and t["at"] is not None and (t["seq"] or 0) < (ready["seq"] or 0)]
    if len(claims) < 2:
        return []
    first, newest = claims[0], claims[-1]
    out = []
    for key, landed, seen in _named_versions(history, record, attachment_id):
        # Last-Modified is stamped when the write lands and truncated to the second: it landed in [landed, landed+1).
        if not (landed + 1.0 + STALE_RESULT_SLACK_SECONDS <= newest["at"] and landed + 1.0 > first["at"]):
            continue
        older = [c for c in claims[:-1] if c["at"] <= landed + 1.0]
        out.append(evidence(
            f"ready names {key!r}, which landed (Last-Modified {seen.get('last_modified')}) before the claim that "
            f"committed began ({newest['at_text']}): the published result is an older claim's "
            f"({older[-1]['at_text'] if older else first['at_text']}) — a stale owner's commit, though its event "
            f"names {ready.get('actor')!r}, attempt {ready.get('attempt')}",
            attachment_id=attachment_id, key=key, last_modified=seen.get("last_modified"),
            newest_claim_at=newest["at_text"], newest_claim_actor=newest.get("actor"),
            older_claim_at=(older[-1] if older else first)["at_text"], commit_at=ready["at_text"],
            commit_actor=ready.get("actor"), commit_attempt=ready.get("attempt"),
            events=[seen] if seen.get("seq") else []))
    return out


def overtaken_results(history: History, record: dict[str, Any], attachment_id: str) -> list[dict[str, Any]]:
    """Fencing judged from what the harness sees alone — the broker's publishes and the bucket — with no event log and
    no claim times: the result ``ready`` published is an older claim's while a newer claim had begun writing its own.

    The job's message reached the work queue again (the tap: a recovery or a retry re-publishes it) before ``ready`` was
    first seen (the API poll, or the ready snapshot). Taking the last such publish: every object ``ready`` names
    surely landed before it (Last-Modified, whole seconds, plus slack), while after it another object of the job
    landed — a key naming the attachment id and one of ready's variant names, not named by ``ready``, first seen by
    the object watch after that publish and not landed before it: a variant written by a claim begun after the
    publish (a claim writes its variants again, CONTRACT §6), which the published result is not. Whose commit it was
    needs no actor: a fenced commit is refused to every claim older than the newest, so an older claim's result
    published over a newer claim at work is a stale owner's commit (the newer claim, refused once ``ready`` is
    committed, may never finish its set). Not judged (no false alarm): an implementation that reuses the older objects
    (it writes no new variant), one that rewrites the same keys (the named objects landed after the publish), a result
    naming any object written after the publish, fewer than two publishes before ``ready``, a job the harness's polls
    never saw taken from its first claim before ``ready`` (back to queued, or at work under another attempt: else the
    publish may duplicate a job committed already), or no object watch."""
    body = record.get("body") or {}
    if body.get("state") != "ready":
        return []
    named = _named_versions(history, record, attachment_id)
    variants = [str(v.get("name") or "") for v in body.get("variants") or [] if v.get("name")]
    if not named or len(named) < len(body.get("variants") or []) or not variants:
        return []
    seen_ready = [e["wall"] for kind in ("state", "snapshot") for e in history.of_type(kind)
                  if e.get("attachment_id") == attachment_id and e.get("state") == "ready"]
    if not seen_ready:
        return []
    ready_seen = min(seen_ready)
    publishes = sorted(e["wall"] for e in history.of_type("message")
                       if isinstance(e.get("body"), dict) and e["body"].get("attachment_id") == attachment_id
                       and e["wall"] < ready_seen)
    if len(publishes) < 2:
        return []
    again = publishes[-1]
    if all(landed >= again for _, landed, _ in named):
        # Every object ready names surely landed after the job's last publish before ready: the result is a claim's
        # begun after it (what a fenced commit leaves), seen from the broker and the bucket.
        return [evidence(f"ready names {len(named)} objects that all landed after the job's message was published "
                         f"again ({iso_time(again)}, publish {len(publishes)} of the job): a newer claim's result",
                         attachment_id=attachment_id, republished_at=iso_time(again), fenced=True,
                         named={key: seen.get("last_modified") for key, _, seen in named})]
    if not all(landed + 1.0 + STALE_RESULT_SLACK_SECONDS <= again for _, landed, _ in named):
        return []
    # The job must have been taken from its first claim before ready, as the harness's own polls saw it: back to
    # queued, or at work under another attempt. Otherwise the publish may duplicate a job already committed (a relay's
    # re-send, a safety net's race) that a consumer rendered again before reading its state, the poll not having seen
    # the ready yet: no stale commit. (The poll writes a line on a change only, so not "seen after the publish".)
    polled = [e for e in history.of_type("state") if e.get("attachment_id") == attachment_id and e["wall"] < ready_seen]
    first = next((e for e in polled if e.get("state") == "processing"), None)
    if first is None or not any(e["seq"] > first["seq"] and (e.get("state") == "queued" or (
            e.get("state") == "processing" and e.get("attempt") != first.get("attempt"))) for e in polled):
        return []
    keys = {key for key, _, _ in named}
    newer: dict[str, dict[str, Any]] = {}
    for e in history.of_type("object"):
        key = str(e.get("key") or "")
        if (attachment_id not in key.lower() or not any(v in key for v in variants) or key in keys or key in newer
                or e["wall"] <= again):
            continue
        landed = parse_time(e.get("last_modified"))
        if landed is not None and landed + 1.0 + STALE_RESULT_SLACK_SECONDS <= again:
            continue  # seen late, landed before the publish
        newer[key] = e
    if not newer:
        return []
    return [evidence(
        f"ready (first seen {iso_time(ready_seen)}) names {len(named)} objects that all landed before the job's "
        f"message was published again ({iso_time(again)}, publish {len(publishes)} of the job), while "
        f"{len(newer)} other variant object(s) of the job landed after that publish "
        f"({', '.join(sorted(newer))}): the published result is an older claim's, committed over a newer claim at "
        "work — a stale owner's commit (seen from the broker and the bucket)", attachment_id=attachment_id,
        republished_at=iso_time(again), ready_seen_at=iso_time(ready_seen),
        named={key: seen.get("last_modified") for key, _, seen in named},
        newer={key: e.get("last_modified") for key, e in sorted(newer.items())},
        events=list(newer.values())[:3])]


def iso_time(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def recovery_held(history: History, run: RunInfo, stop: dict[str, Any], cont: dict[str, Any] | None) -> list[str]:
    """The recovering roles (other than the paused one) kept stopped from before the pause until after it ended:
    their names, or [] when none were (or the adapter flags none)."""
    from .ack_after_commit import hold_intervals
    from .base import recovering_roles

    others = recovering_roles(run) - {role_kind(stop.get("role"))}
    if not others or cont is None:
        return []
    for start, end, _ in hold_intervals(history, others):
        if start <= stop["wall"] and (end is None or end >= cont["wall"]):
            return sorted(others)
    return []


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    lease = timing(run, "lease_seconds")
    paused = pauses(history, consumer_roles(run))
    if paused and lease is None:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "a consumer was paused, but the adapter declares no "
                       "lease_seconds: cannot tell whether the pause outlasted the lease", seed=seed_of(run))
    ids = sorted(set((final or {}).get("attachments", {})))
    problems, proven = [], []
    # Fencing, over the whole run: once attempt n+1 has claimed, attempt n writes nothing more.
    for attachment_id in ids:
        trans = transitions_of(history, final, attachment_id)
        newest = 0
        for t in trans:
            a = t["attempt"] if isinstance(t["attempt"], int) else None
            if a is None:
                continue
            if a < newest and t["from"] == "processing":
                problems.append(evidence(f"stale owner (attempt {a}) wrote {t['from']}→{t['to']} after attempt "
                                         f"{newest} claimed", attachment_id=attachment_id, seq=t["seq"], at=t["at_text"]))
            newest = max(newest, a)
        for t, older, newer in stale_commits(trans):
            if any(p.get("seq") == t["seq"] and p.get("attachment_id") == attachment_id for p in problems):
                continue
            problems.append(evidence(
                f"stale owner ({older['actor']}, claim of {older['at_text']}) committed {t['from']}→{t['to']} after "
                f"a newer claim by {newer['actor']} at {newer['at_text']} (the commit carries attempt {t['attempt']})",
                attachment_id=attachment_id, seq=t["seq"], at=t["at_text"]))
        if not any(p.get("attachment_id") == attachment_id for p in problems):
            problems += stale_results(history, (final or {}).get("attachments", {}).get(attachment_id) or {},
                                      attachment_id, trans)
    republished_ready: list[dict[str, Any]] = []  # jobs whose ready came after a republish, naming objects written after it
    for attachment_id in ids:
        for found in overtaken_results(history, (final or {}).get("attachments", {}).get(attachment_id) or {},
                                       attachment_id):
            (republished_ready if found.get("fenced") else problems).append(found)
    claimed, measured = lease_claim(history, final, run, ids)
    problems += claimed
    exercised = bool(republished_ready)
    for stop, cont in paused:
        paused_for = (cont["wall"] if cont else float("inf")) - stop["wall"]
        if paused_for <= lease:
            continue
        for attachment_id in ids:
            trans = transitions_of(history, final, attachment_id)
            flight = in_flight_at(trans, stop["wall"])
            if flight is None:
                continue
            exercised = True
            later = [t for t in trans if (t["seq"] or 0) > (flight["seq"] or 0)]
            done = next((t for t in later if t["to"] in TERMINAL_STATES), None)
            # Recovered while it slept: the job left the paused owner (a lease recovery, or its end) before SIGCONT.
            # The new owner may still be finishing a large image when the old one wakes; it is fenced either way.
            left = next((t for t in later if t["at"] is not None), None)
            base: dict[str, Any] = dict(attachment_id=attachment_id, events=[stop, cont], paused_seconds=round(paused_for, 2),
                        lease_seconds=lease, attempt=flight["attempt"])
            held = recovery_held(history, run, stop, cont)
            if held:  # every role that recovers work was stopped on purpose (stale_ack): nobody could recover it
                proven.append(evidence("job of a paused owner not recovered: every recovering role was held",
                                       held=held, **base))
            elif level_of(run) >= 4 and cont and (left is None or left["at"] > cont["wall"]):
                problems.append(evidence("job of a worker paused past its lease was not recovered while it slept",
                                         **base))
            else:
                proven.append(evidence("job recovered from the paused owner", reached=done and done["to"], **base))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} ownership violations", evidence=problems,
                       seed=seed_of(run))
    paused_part = ((f"{sum(1 for p in proven if not p.get('held'))} jobs recovered from paused owners"
                    + (f", {sum(1 for p in proven if p.get('held'))} not (recovery held)"
                       if any(p.get("held") for p in proven) else "")) if proven else "")
    republished_part = (f"{len(republished_ready)} ready after the job's message was published again, naming "
                        "objects written after it (the newer claim's)" if republished_ready else "")
    return Verdict(NAME, VALID, REQUIREMENTS,
                   (", ".join(x for x in (paused_part, republished_part) if x) + "; no stale writes") if exercised
                   else "no stale writes; no job held by a worker paused past its lease",
                   exercised=exercised, evidence=proven + republished_ready[:3] + measured[:3], seed=seed_of(run))
