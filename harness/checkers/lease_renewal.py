"""Lease renewal delayed and refused (BE-JOB-006.2): no effect begins without a lease.

Two provocations, both on the consumers' own database link (a network fault with a ``role``; a fault on the whole
service counts too):

* **refused** — the link is cut, reset or blackholed for longer than the lease while a consumer holds a job. Its
  last renewal can have reached the database no later than the refusal began, so its lease ran out by
  ``start + lease_seconds`` at the latest. From then until the link is back — or, when the held jobs were recovered
  meanwhile (so no stale owner may revive its lease), until the next claim of any job — no consumer holds any
  lease, so no effect may *begin*: an object that lands in the bucket (seen by the run's object watch, ``watch_objects``; its
  Last-Modified) later than that, plus one slowed S3 round trip (a write sent in time may land one round trip late:
  ``Expect: 100-continue``) and half a second, is an effect begun without a lease → ``invalid``. Originals of
  accepted uploads are not effects of a consumer; an object landing while an upload was still unanswered is not
  attributed. At level 4, when a role that recovers work kept its own link and the refusal outlasted the lease by
  two sweeps, the job must have left ``processing`` (a lease recovery) before the link came back → else
  ``invalid``. The stale claim's own writes after the takeover are judged by ``lease_ownership`` (fencing).
* **delayed** — the link only answers late (a latency fault, no refusal, no pause or kill of a consumer). A claim
  whose life overlapped such a span for longer than a lease (so at least one renewal went through the delay), with
  no refusal, pause or kill of a consumer in it, and that ended ``ready`` on that claim renewed through the delay in
  time: that is what this check needs to see. A claim that went back to ``queued`` instead is only
  reported (a transient error and a lost lease look the same from outside).

Exercised only when both were seen: a refusal with a job in flight under an object watch, and a claim that lived
on delayed renewals. Unknown when a timing it needs is not declared.
"""

from __future__ import annotations

from typing import Any

from .ack_after_commit import in_flight_at
from ..history import Event, History
from .base import (INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, consumer_roles, evidence, final_read_ok,
                   level_of, parse_time, recovering_roles, role_kind, seed_of, timing, transitions_of, undecided, FinalState, RunInfo)

NAME = "lease_renewal"
REQUIREMENTS = ["BE-JOB-006"]
TIMINGS = ("lease_seconds",)
REFUSALS = ("cut", "reset_peer", "blackhole")
# Last-Modified has whole seconds and is stamped when the write lands: never later than the real time, but a write
# may land after the request left. Half a second on top of one slowed round trip.
SLACK_SECONDS = 0.5


def intervals(history: History, service: str, toxics: tuple[str, ...], roles: frozenset[str]) -> list[dict[str, Any]]:
    """Toxic faults on ``service`` that reached every role in ``roles`` (a role-scoped fault on one of them, or a
    fault on the whole service): {"start", "end" (None while open), "roles", "toxic", "params", "events"}."""
    out, open_ = [], {}
    for e in history.of_type("fault"):
        if e.get("action") != "toxic" or e.get("service") != service or e.get("toxic") not in toxics:
            continue
        key = (e.get("toxic"), e.get("role"))
        if e.get("phase") == "start":
            open_[key] = e
        elif e.get("phase") == "end" and key in open_:
            start = open_.pop(key)
            out.append({"start": start["wall"], "end": e["wall"], "role": start.get("role"), "toxic": start["toxic"],
                        "params": start.get("params") or {}, "events": [start, e]})
    for (toxic, role), start in open_.items():
        out.append({"start": start["wall"], "end": None, "role": role, "toxic": toxic,
                    "params": start.get("params") or {}, "events": [start]})
    return [i for i in out if i["role"] is None or role_kind(i["role"]) in roles]


def covers(spans: list[dict[str, Any]], roles: frozenset[str], start: float, end: float) -> bool:
    """Whether, over [start, end], every role in ``roles`` was under one of ``spans`` (a whole-service one counts for
    all): spans of one kind are merged per role first."""
    for role in roles:
        mine = sorted(((s["start"], s["end"] if s["end"] is not None else float("inf")) for s in spans
                       if s["role"] is None or role_kind(s["role"]) == role))
        reach = start
        for lo, hi in mine:
            if lo > reach:
                break
            reach = max(reach, hi)
        if reach < end:
            return False
    return True


def overlaps(spans: list[dict[str, Any]], start: float, end: float) -> bool:
    return any(s["start"] < end and (s["end"] is None or s["end"] > start) for s in spans)


def consumer_disruptions(history: History, consumers: frozenset[str]) -> list[dict[str, Any]]:
    """Pauses, kills and crashes of a consumer: a claim spanning one did not live on renewals alone."""
    out, paused = [], {}
    for e in history.of_type("fault"):
        if role_kind(e.get("role")) not in consumers:
            continue
        if e.get("action") == "sigstop":
            paused[e.get("role")] = e["wall"]
        elif e.get("action") == "sigcont" and e.get("role") in paused:
            out.append({"start": paused.pop(e.get("role")), "end": e["wall"]})
        elif e.get("action") in ("sigkill", "crash") and e.get("phase") in ("start", "hit"):
            out.append({"start": e["wall"], "end": e["wall"] + 0.001})
    out += [{"start": start, "end": None} for start in paused.values()]
    return out


def claims(trans: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(→processing transition, the next transition or None) for every claim of one attachment."""
    out = []
    for i, t in enumerate(trans):
        if t["to"] == "processing":
            out.append((t, trans[i + 1] if i + 1 < len(trans) else None))
    return out


def upload_spans(history: History) -> list[tuple[float, float]]:
    spans = []
    for op in history.operations().values():
        if op["invoke"].get("f") != "upload":
            continue
        end = op["complete"]["wall"] if op["complete"] else float("inf")
        spans.append((op["invoke"]["wall"], end))
    return spans


def promised_variants(final: FinalState, attachment_id: str) -> int | None:
    """How many variant objects the job's ``ready`` names (None unless the final read saw it ready)."""
    body = (((final or {}).get("attachments") or {}).get(attachment_id) or {}).get("body") or {}
    if body.get("state") != "ready" or not body.get("variants"):
        return None
    return len(body["variants"])


def writes_done_in_time(objects: list[Event], originals: set[Any], attachment_id: str, held: int,
                        flight: dict[str, Any], no_lease_from: float, promised: int | None) -> int | None:
    """The number of distinct objects of the held claim that landed between its claim and the moment its lease
    had surely run out, when that is already every object its job's ``ready`` names (so nothing was left to write
    without a lease); else None. An object is the held job's when it is the only job held, or when its key names
    the attachment."""
    if promised is None or flight.get("at") is None:
        return None
    keys: set[Any] = set()
    for obj in objects:
        landed = parse_time(obj.get("last_modified"))
        key = obj.get("key")
        # Not after no_lease_from (whole seconds): not shown to have landed late, so counted as written in time.
        if landed is None or key in originals or not (flight["at"] - 1.0 <= landed <= no_lease_from):
            continue
        if held == 1 or attachment_id in str(key):
            keys.add(key)
    return len(keys) if len(keys) >= promised else None


def unnamed_after(objects: list[Event], originals: set[Any], final: FinalState, attachment_id: str, held: int,
                  after: float) -> Event | None:
    """The first object of the held job (the only job held, or its key names the attachment) that landed after
    ``after`` at a key the job's final ``ready`` does not name; None when there is none or the job is not ready."""
    body = (((final or {}).get("attachments") or {}).get(attachment_id) or {}).get("body") or {}
    if body.get("state") != "ready":
        return None
    named = {v.get("key") for v in body.get("variants") or []}
    for obj in objects:
        landed = parse_time(obj.get("last_modified"))
        key = obj.get("key")
        if landed is None or key in originals or key in named or landed + 1.0 <= after:
            continue
        if held == 1 or attachment_id in str(key):
            return obj
    return None


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    consumers, recovering = consumer_roles(run), recovering_roles(run)
    refusals = intervals(history, "postgres", REFUSALS, consumers)
    delays = intervals(history, "postgres", ("latency",), consumers)
    if not refusals and not delays:
        return Verdict(NAME, VALID, REQUIREMENTS, "no delay or refusal of the consumers' database link: nothing to "
                       "judge", exercised=False, seed=seed_of(run))
    lease = timing(run, "lease_seconds")
    if lease is None:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "the consumers' database link was delayed or refused, but the "
                       "adapter declares no lease_seconds: cannot tell when a lease ran out", seed=seed_of(run))
    sweep = timing(run, "sweep_interval_seconds")
    ids = sorted(set((final or {}).get("attachments", {})))
    trans_of = {a: transitions_of(history, final or {}, a) for a in ids}
    watched = [e for e in history.of_type("phase") if e.get("name") == "object_watch_start"]
    watch_end = next((e for e in history.of_type("phase") if e.get("name") == "object_watch_end"), None)
    objects = history.of_type("object")
    originals = {((r.get("body") or {}).get("original") or {}).get("key") for r in (final or {}).get("attachments",
                                                                                                        {}).values()}
    uploads = upload_spans(history)
    s3_delays = intervals(history, "s3", ("latency",), consumers)
    disrupted = consumer_disruptions(history, consumers)
    problems, proven_refused, proven_delayed, notes, missed = [], [], [], [], []

    # --- refused: no effect begins after the lease ran out --------------------------------------------------------
    for r in refusals:
        end = r["end"] if r["end"] is not None else float("inf")
        if end - r["start"] <= lease or not covers(refusals, consumers, r["start"], min(end, r["start"] + 3600)):
            continue  # shorter than the lease, or some consumer could still renew
        in_flight = [(a, in_flight_at(trans_of[a], r["start"])) for a in ids]
        held = [(a, f) for a, f in in_flight if f is not None]
        if not held:
            continue
        round_trip = max([float(s["params"].get("ms", 0)) / 1000 for s in s3_delays
                          if s["start"] < end and (s["end"] is None or s["end"] > r["start"])] or [0.0])
        no_lease_from = r["start"] + lease + round_trip + SLACK_SECONDS
        # Until the link is back nobody holds a lease. A job recovered meanwhile cannot be revived by its stale
        # owner either: the window runs on until the next claim of any job (a claim may write).
        recovered = all(any(t["at"] is not None and r["start"] < t["at"] <= end and (t["seq"] or 0) > (f["seq"] or 0)
                            for t in trans_of[a]) for a, f in held)
        next_claim = min([t["at"] for a in ids for t in trans_of[a]
                          if t["to"] == "processing" and t["at"] is not None and t["at"] > r["start"]] or [end])
        no_lease_until = max(end, next_claim) if recovered else end
        base: dict[str, Any] = dict(events=r["events"], refused_seconds=round(end - r["start"], 2), lease_seconds=lease,
                    no_lease_from=no_lease_from)
        if watched and (watch_end is None or watch_end.get("lists", 1) > 0):
            for obj in objects:
                landed = parse_time(obj.get("last_modified"))
                # Last-Modified counts whole seconds: the write landed within the second after it.
                if landed is None or not (no_lease_from < landed and landed + 1.0 <= no_lease_until) \
                        or obj.get("key") in originals:
                    continue
                if any(lo <= landed + 1 and hi >= landed - 1 for lo, hi in uploads):
                    notes.append(f"object {obj.get('key')} landed while an upload was unanswered: not attributed")
                    continue
                named = [a for a, _ in held if a in str(obj.get("key"))]
                owner = named[0] if named else (held[0][0] if len(held) == 1 else None)
                problems.append(evidence(
                    f"object {obj.get('key')!r} landed {landed - r['start']:.1f}s after the consumers' database link "
                    f"was refused (for {end - r['start']:.1f}s; next claim {no_lease_until - r['start']:.1f}s after): "
                    f"the lease ({lease:g}s) had run out, no consumer held one, yet an effect began",
                    attachment_id=owner, events=[obj, *r["events"]], key=obj.get("key"),
                    last_modified=obj.get("last_modified"), refused_at=r["start"], no_lease_from=round(no_lease_from, 3),
                    held=[a for a, _ in held]))
        for attachment_id, flight in held:
            trans = trans_of[attachment_id]
            later = [t for t in trans if (t["seq"] or 0) > (flight["seq"] or 0) and t["at"] is not None]
            left = next(iter(later), None)
            done = writes_done_in_time(objects, originals, attachment_id, len(held), flight, no_lease_from,
                                       promised_variants(final, attachment_id))
            if watched and done is not None:
                # Every write the claim had to make landed before its lease ran out: no effect was due while it held
                # no lease, so the refusal proves nothing about one (a renewal ignored would look the same).
                missed.append(evidence(
                    f"every write of the held claim ({done} objects, as many as its job's ready names) landed before "
                    f"its lease ran out ({no_lease_from - r['start']:.1f}s into the refusal): no effect was due "
                    "without a lease, the window was not hit", attachment_id=attachment_id,
                    attempt=flight["attempt"], **base))
            elif watched and (late := unnamed_after(objects, originals, final, attachment_id, len(held),
                                                   no_lease_until)):
                # A write landed once the window had closed (the next claim may write from then on), at a key the
                # job's ready does not name: a stale claim's late write or a claim that did not commit — not told
                # apart, so the window was not shown to hold (a stale owner slower than the window looks like this).
                missed.append(evidence(
                    f"object {late['key']!r} landed after the window closed ({no_lease_until - r['start']:.1f}s into "
                    "the refusal: the link back, or the next claim) and the job's ready does not name it: perhaps "
                    "the stale owner's late write, perhaps not — the window was not hit for sure",
                    attachment_id=attachment_id, attempt=flight["attempt"], key=late["key"],
                    last_modified=late.get("last_modified"), **base))
            elif watched:
                proven_refused.append(evidence("job held when its owner's renewals were refused",
                                               attachment_id=attachment_id, attempt=flight["attempt"],
                                               reached=(next((t for t in later if t["to"] in TERMINAL_STATES), {})
                                                        or {}).get("to"), **base))
            can_recover = (recovering - consumers) and not covers(refusals, recovering - consumers, r["start"], end)
            if (level_of(run) >= 4 and can_recover and sweep is not None and end - r["start"] > lease + 2 * sweep + 1
                    and (left is None or left["at"] > end)):
                problems.append(evidence(
                    f"job stayed with an owner that could not renew for {end - r['start']:.1f}s (lease {lease:g}s, "
                    f"sweep {sweep:g}s): not recovered while a recovering role kept its link",
                    attachment_id=attachment_id, attempt=flight["attempt"], **base))

    # --- delayed: a claim outliving its lease on late renewals ends ready on that claim -------------------------
    for attachment_id in ids:
        for claim, nxt in claims(trans_of[attachment_id]):
            if claim["at"] is None or nxt is None or nxt["at"] is None or nxt["at"] - claim["at"] <= lease:
                continue
            lo, hi = claim["at"], nxt["at"]
            if overlaps(refusals, lo, hi) or overlaps(disrupted, lo, hi):
                continue
            # Delayed for more than a lease of the claim's life: at least one renewal went through the delay.
            delayed = [(max(lo, d["start"]), min(hi, d["end"] if d["end"] is not None else hi)) for d in delays]
            if not any(b - a > lease and covers(delays, consumers, a, b) for a, b in delayed):
                continue
            item = evidence(f"claim lived {hi - lo:.1f}s (lease {lease:g}s) on renewals delayed by the consumers' "
                            f"database link, and ended {nxt['to']}", attachment_id=attachment_id,
                            attempt=claim["attempt"], claimed_at=claim["at_text"], ended_at=nxt["at_text"])
            if nxt["to"] == "ready":
                proven_delayed.append(item)
            else:
                notes.append(item["message"] + f" ({attachment_id})")

    seed = seed_of(run)
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} effects or holds without a lease",
                       evidence=problems, seed=seed)
    if refusals and any(in_flight_at(trans_of[a], r["start"]) for r in refusals for a in ids) and watched and \
            watch_end is not None and watch_end.get("lists", 1) == 0:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "the object watch never listed the bucket: effects during the "
                       "refusal not seen", seed=seed)
    if missed and not proven_refused:
        # A refusal past the lease with a job in flight, but its writes were all done in time: a timing miss.
        return undecided(NAME, REQUIREMENTS, f"{len(missed)} jobs held through a refusal past the lease: "
                         f"{missed[0]['message']}; whether an effect begins without a lease was not shown",
                         NAME in ((run.get("scenario") or {}).get("checks") or []), seed, missed + proven_delayed,
                         unknown_prefix="window not hit")
    exercised = bool(proven_refused) and bool(proven_delayed)
    missing = ([] if proven_refused else ["no job held while the consumers' database link was refused past a lease "
                                          "under an object watch"]) + \
              ([] if proven_delayed else ["no claim outlived its lease on delayed renewals"])
    summary = (f"{len(proven_refused)} jobs held through a refused renewal began no effect after their lease; "
               f"{len(proven_delayed)} claims outlived the lease on delayed renewals and ended ready"
               + ("" if exercised else "; not exercised: " + "; ".join(missing)))
    if not final_read_ok(final or {}):
        summary += " (final state not read: transitions as observed)"
    return Verdict(NAME, VALID, REQUIREMENTS, summary, exercised=exercised,
                   evidence=proven_refused + proven_delayed + [{"message": n} for n in notes[:10]], seed=seed)
