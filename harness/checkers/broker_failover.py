"""Roles fail over to another broker node when theirs is lost (a RabbitMQ cluster: ``kill_broker_node``,
``partition_broker_node``; the contract's AMQP_URLS lists every node).

Evidence, from the harness's own looks while the node is lost (``queue kind=node_lost`` lines, every ~0.5 s, until
the node is back or its link restored): the work queue's consumers, counted exactly through another node, and the
implementation's connections on the other nodes (management API, shown, not judged: a role may rightly reconnect
only when it next needs the broker). The fault's start line says how many of the implementation's connections the
lost node held.

- No connection of the implementation on the lost node (the management API listing its connections elsewhere) and
  consumers on the work queue all along: nothing had to fail over — valid, not exercised. An empty listing proves
  nothing (statistics lag behind roles that just started): the looks are judged as below.
- Consumers: every look of the outage's last ``GRACE`` seconds shows none on the work queue — the consumers stayed
  with the lost node: invalid.
- Publishers: an upload accepted while the node was lost, at least ``GRACE`` seconds before the last look, whose
  job message the tap saw only after the outage (``SLACK`` for the tap's own lag) — the publisher waited for the
  lost node: invalid.
- Fewer than ``GRACE`` seconds from the loss to the last look, or no look that could count: unknown.
"""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import INVALID, UNKNOWN, VALID, Verdict, accepted_attachments, consumer_roles, evidence, not_proven, seed_of, FinalState, RunInfo

NAME = "broker_failover"
REQUIREMENTS: list[str] = []
ACTIONS = ("kill_broker_node", "partition_broker_node")
GRACE = 3.0  # seconds a role had to reconnect elsewhere, at the end of an outage
SLACK = 0.5  # the tap's lag between a publish and its history line


def outages(history: History) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(start, end or None) of every broker node lost in the run."""
    out, open_ = [], {}
    for e in history.of_type("fault"):
        if e.get("action") not in ACTIONS:
            continue
        key = (e.get("action"), e.get("node"))
        if e.get("phase") == "start":
            open_[key] = e
        elif e.get("phase") == "end" and key in open_:
            out.append((open_.pop(key), e))
    return out + [(s, None) for s in open_.values()]


def first_tapped(history: History) -> dict[str, float]:
    """attachment_id -> wall of the first job message the tap saw for it."""
    seen: dict[str, float] = {}
    for m in history.of_type("message"):
        body: dict[str, Any] = m["body"] if isinstance(m.get("body"), dict) else {}
        if body.get("attachment_id") and str(body["attachment_id"]) not in seen:
            seen[str(body["attachment_id"])] = m["wall"]
    return seen


def judge(start: dict[str, Any], looks: list[dict[str, Any]], accepted: dict[str, float], tapped: dict[str, float]) -> tuple[str, dict[str, Any]]:
    node = start.get("node")
    before = start.get("connections")
    held = None if before is None else int(before.get(node, 0))
    counted = [look for look in looks if look.get("consumers") is not None]
    # From the loss to the last look (a look may take a second or more on a loaded machine).
    span = (counted[-1]["wall"] - start["wall"]) if counted else 0.0
    facts = {"node": node, "target": start.get("target"), "connections_on_lost_node": held,
             "connections_before": None if before is None else sum(int(n) for n in before.values()),
             "looks": len(looks), "seconds": round(span, 2)}
    # Idle only when the management API did list the implementation's connections, none on the lost node, and its
    # consumers stayed: an empty list may be the statistics lagging behind roles that just started.
    if held == 0 and facts["connections_before"] and counted and all((look.get("consumers") or 0) > 0 for look in counted):
        return "idle", {**facts, "why": f"no connection of the implementation was on {node} when it was lost"}
    if not counted:
        return UNKNOWN, {**facts, "why": "the work queue could not be counted through another node"}
    last = counted[-1]["wall"]
    tail = [look for look in counted if look["wall"] >= last - GRACE]
    facts.update(consumers_at_end=counted[-1].get("consumers"),
                 connections_elsewhere_at_end=counted[-1].get("connections_elsewhere"))
    problems = []
    if span >= GRACE and not any((look.get("consumers") or 0) > 0 for look in tail):
        problems.append(f"no consumer on the work queue through any other node for the last {GRACE:.0f}s of the "
                        "outage")
    due = sorted(a for a, at in accepted.items() if start["wall"] <= at <= last - GRACE)
    late = [a for a in due if tapped.get(a) is None or tapped[a] > last + SLACK]
    facts.update(published_while_lost=len(due) - len(late), accepted_while_lost=len(due))
    if late:
        problems.append(f"{len(late)} of {len(due)} uploads accepted while the node was lost had no job message "
                        f"published until it was back")
        facts["attachment_ids"] = late
    if problems:
        return INVALID, {**facts, "why": "; ".join(problems)}
    if span < GRACE:
        return UNKNOWN, {**facts, "why": f"the node was lost for less than {GRACE:.0f}s of looks: too short to tell"}
    return VALID, facts


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    lost = outages(history)
    if not lost:
        return not_proven(NAME, REQUIREMENTS, "broker failover", "no broker node was lost in this run", run, [])
    roles = ",".join(sorted(consumer_roles(run)))
    looks = [e for e in history.of_type("queue") if e.get("kind") == "node_lost"]
    accepted = {a: e["ok"]["wall"] for a, e in accepted_attachments(history).items()}
    tapped = first_tapped(history)
    results = []
    for start, end in lost:
        until = end["wall"] if end else float("inf")
        mine = [look for look in looks if look.get("node") == start.get("node") and start["wall"] <= look["wall"] <= until]
        results.append(judge(start, mine, accepted, tapped))
    bad = [f for s, f in results if s == INVALID]
    unsure = [f for s, f in results if s == UNKNOWN]
    moved = [f for s, f in results if s == VALID]
    if bad:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(bad)} of {len(results)} lost broker nodes: the "
                       f"implementation stayed with the lost node ({bad[0]['why']})",
                       evidence=[evidence(f"{f['target']} node {f['node']} lost: {f['why']}", role=roles,
                                          **{k: v for k, v in f.items() if k != "why"}) for f in bad],
                       seed=seed_of(run))
    if unsure:
        asked = NAME in ((run.get("scenario") or {}).get("checks") or [])
        return Verdict(NAME, UNKNOWN if asked else VALID, REQUIREMENTS,
                       f"broker failover not proven: {unsure[0]['why']}", exercised=False,
                       evidence=[evidence(f["why"], **{k: v for k, v in f.items() if k != "why"}) for f in unsure],
                       seed=seed_of(run))
    if not moved:
        return Verdict(NAME, VALID, REQUIREMENTS, "nothing had to fail over: " + results[0][1]["why"],
                       exercised=False, seed=seed_of(run))
    f = moved[0]
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{len(moved)} lost broker node(s): the roles failed over ({f['connections_on_lost_node']} "
                   f"connections were on {f['node']}; while it was lost: {f['consumers_at_end']} consumers through "
                   f"another node, {f['published_while_lost']} of {f['accepted_while_lost']} uploads accepted meanwhile "
                   f"published, {f['connections_elsewhere_at_end']} connections elsewhere)",
                   evidence=[evidence(f"{m['target']} node {m['node']} lost", **m) for m in moved], seed=seed_of(run))
