"""Were the harness's faults left as it set them? (a verdict of its own: ``tampered``)

While a network fault is in force, when the harness removes it and at heal, chaos/network.py re-reads the run's
Toxiproxy proxies and records a ``tamper`` line for every difference the harness did not make (a cut proxy enabled
again or accepting connections, a toxic deleted or changed, a toxic added, a proxy deleted or moved), and one
summary line per fault (``found`` intact, changed or unread). A submission that heals the faults it is graded under
(through the Toxiproxy API it can reach) would otherwise pass as if it had survived them: fault_coverage only knows
the harness *asked* for the fault. One change is enough: the run is ``tampered`` — worse than invalid, since nothing
else it shows can be trusted — with the scenario, the fault, what was expected, what was found and when.

``valid`` when every network fault the run applied was read back in force (at least once) and unchanged; ``unknown``
when one could not be read back at all (Toxiproxy did not answer, a run recorded before the checks existed); idle
(valid, not exercised) in a run with no network fault.

Any other part of the harness that verifies what it owns (the tap's queue and bindings, a failpoint value, a clock
offset) reports a change the same way: a ``tamper`` line with ``found="changed"``, ``what``, ``expected``,
``observed`` (and ``fault`` / ``link`` where they apply). Every such line makes the run ``tampered``.

Under isolation an attempt counts too, contained or not: the network rules count the submission's loopback TCP
connections to ports its environment does not name (the Toxiproxy API, the broker's management, the database's own
port, another tenant's services) and the supervisor records them as a ``tamper`` line with ``found="attempted"``
(packets, ports). A correct service connects only where it was told to; one that probes the grader is ``tampered``
even when every probe was refused.
"""

from __future__ import annotations

from ..history import History
from .base import TAMPERED, UNKNOWN, VALID, Verdict, evidence, seed_of, undecided, FinalState, RunInfo

NAME = "tamper_evidence"
REQUIREMENTS: list[str] = []
NETWORK_ACTIONS = ("toxic", "partition_broker_node")


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    scenario = (run.get("scenario") or {}).get("name")
    lines = history.of_type("tamper")
    changed = [e for e in lines if e.get("found") == "changed" and not e.get("summary")]
    if changed:
        found = [evidence(f"{scenario}: fault {e.get('fault')} ({e.get('kind')} on {e.get('link')}): {e.get('what')} "
                          f"{e.get('when', 'in force')}, {e.get('in_force_seconds')}s after the harness set it — "
                          f"expected {e.get('expected')}, found {e.get('observed')}",
                          events=[e], scenario=scenario, fault=e.get("fault"), link=e.get("link"),
                          expected=e.get("expected"), observed=e.get("observed"))
                 for e in changed]
        faults = sorted({str(e.get("fault")) for e in changed})
        return Verdict(NAME, TAMPERED, REQUIREMENTS,
                       f"what the harness set (its faults, its tap) was changed by someone else: {len(changed)} changes "
                       f"to fault{'s' if len(faults) > 1 else ''} {', '.join(faults)} of {scenario} (first at "
                       f"t={changed[0].get('t')}s: {changed[0].get('what')} on {changed[0].get('link')})",
                       evidence=found, seed=seed_of(run))
    attempted = [e for e in lines if e.get("found") == "attempted"]
    if attempted:
        ports = sorted({p for e in attempted for p in e.get("ports") or []})
        packets = sum(int(e.get("packets") or 0) for e in attempted)
        return Verdict(NAME, TAMPERED, REQUIREMENTS,
                       f"the submission tried to reach what isolation withholds from it: {packets} loopback "
                       f"connections refused (ports {', '.join(map(str, ports[:10])) or 'not recorded'}"
                       f"{f' and {len(ports) - 10} more' if len(ports) > 10 else ''}) — an attempt on "
                       "the grader, whatever it achieved",
                       evidence=[evidence(f"{scenario}: {e.get('what')}: {e.get('packets')} packets, ports "
                                          f"{e.get('ports')}", events=[e], scenario=scenario,
                                          packets=e.get("packets"), ports=e.get("ports"))
                                 for e in attempted], seed=seed_of(run))
    network = [s for s in run.get("schedule") or [] if s.get("action") in NETWORK_ACTIONS]
    summaries = [e for e in lines if e.get("summary")]
    applied = [e for e in history.of_type("fault") if e.get("action") == "toxic" and e.get("phase") == "start"]
    if not network and not applied:
        return undecided(NAME, REQUIREMENTS, "no network fault in this run (nothing of the harness's to re-read)",
                         False, seed_of(run))
    intact = [e for e in summaries if e.get("found") == "intact" and e.get("checks")]
    unread = [e for e in summaries if e.get("found") != "intact" or not e.get("checks")]
    unverified = [evidence(f"{scenario}: fault {e.get('fault')} ({e.get('kind')} on {e.get('link')}) never read back "
                           f"in force ({e.get('unread')} reads failed"
                           + (f": {e.get('read_error')}" if e.get("read_error") else "") + ")",
                           events=[e], scenario=scenario, fault=e.get("fault")) for e in unread]
    if len(summaries) < len(applied):
        unverified.append(evidence(f"{scenario}: {len(applied)} network faults applied, {len(summaries)} verified "
                                   "(no tamper check recorded for the others)", scenario=scenario,
                                   applied=len(applied), verified=len(summaries)))
    if unverified or not intact:
        missing = len(unread) + max(0, len(applied) - len(summaries))
        return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                       f"cannot tell whether the harness's faults stayed as it set them: {missing} of "
                       f"{max(len(applied), len(summaries))} network faults not read back in force",
                       evidence=unverified or [evidence(f"{scenario}: no network fault was read back in force",
                                                        scenario=scenario)], seed=seed_of(run))
    found = [evidence(f"{scenario}: fault {e.get('fault')} ({e.get('kind')} on {e.get('link')}) read back "
                      f"{e.get('checks')} times over {e.get('in_force_seconds')}s, as set", events=[e],
                      scenario=scenario, fault=e.get("fault")) for e in intact]
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{len(intact)} network faults read back in force {sum(e['checks'] for e in intact)} times: "
                   "unchanged by anyone but the harness", evidence=found, seed=seed_of(run))
