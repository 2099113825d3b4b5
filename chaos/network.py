"""Network faults through Toxiproxy: cut, blackhole, reset_peer and latency on postgres, rabbitmq or s3.

Tamper evidence: what the harness sets is what it expects to find. While a fault is in force a light watcher re-reads
this run's proxies (one GET every ``VERIFY_EVERY`` seconds) and compares each faulted link with what the harness set:
a cut proxy still disabled, and a connection through it refused; each toxic still there with its type, stream,
toxicity and attributes; nothing else added. Once more when the harness itself removes the fault, and at heal. Any
difference the harness did not make is a ``tamper`` line (``found="changed"``: scenario's fault index, link, what was
expected, what was found, its time); each fault ends with one ``tamper`` line of its own (``found="intact"`` or
``"changed"``, with how many checks read it and how many saw it changed; ``"unread"`` when no check could read
Toxiproxy). The harness changes the state only under the guard's lock, having recorded what it expects first, so
its own changes are never mistaken for tampering. ``harness/checkers/tamper_evidence.py`` judges these lines.
"""

from __future__ import annotations

import threading
import time

from harness.toxiproxy import probe_refused

KINDS = ("cut", "blackhole", "reset_peer", "latency")
VERIFY_EVERY = 0.5

# The attributes each toxic is set with (what the harness compares; Toxiproxy's own defaults are not compared).
_TOXIC = {"blackhole": ("timeout", lambda p: {"timeout": 0}),
          "reset_peer": ("reset_peer", lambda p: {"timeout": int(p.get("after_ms", 0))}),
          "latency": ("latency", lambda p: {"latency": int(p.get("ms", 500)), "jitter": int(p.get("jitter_ms", 0))})}


def fault_index() -> int | None:
    """The scenario fault this thread runs (the runner names each step's thread ``fault-<index>``)."""
    name = threading.current_thread().name
    if name.startswith("fault-") and name[6:].isdigit():
        return int(name[6:])
    return None


class NetworkFaults:
    def __init__(self, toxiproxy, history, verify_every: float = VERIFY_EVERY):
        self.toxiproxy = toxiproxy
        self.history = history
        self.verify_every = verify_every
        self.lock = threading.RLock()  # the harness's own changes and every check: a check never sees half a change
        self.in_force: dict[int, dict] = {}  # key -> {"link", "kind", "fault", "toxic", "expect", "checks", ...}
        self._next = 0
        self._watcher: threading.Thread | None = None
        if toxiproxy is not None:
            try:
                toxiproxy.guard = self  # heal_all (chaos/heal.py) verifies once more before it resets the proxies
            except AttributeError:
                pass

    # --- faults -----------------------------------------------------------------------------------------
    def apply(self, service: str, kind: str, params: dict | None = None, role: str | None = None,
              fault: int | None = None) -> str | None:
        """Start a fault; returns the toxic name (None for cut, which disables the proxy). With ``role``: on that
        role's own link to the service (a proxy the runner gave it), not on every role's."""
        params = dict(params or {})
        fault = fault if fault is not None else fault_index()
        self.history.append("fault", action="toxic", toxic=kind, phase="start", service=service, params=params,
                            **({"role": role} if role else {}), **({"fault": fault} if fault is not None else {}))
        link = f"{service}@{role}" if role else service
        if kind not in KINDS:
            raise ValueError(f"unknown network fault {kind!r}; one of {KINDS}")
        stream = params.get("stream", "downstream")
        with self.lock:
            entry = self._expect(link, kind, fault, params)  # what it expects, before it changes anything
            try:
                if kind == "cut":
                    self.toxiproxy.cut(link)
                    name = None
                elif kind == "blackhole":
                    name = self.toxiproxy.blackhole(link, stream=stream)
                elif kind == "reset_peer":
                    name = self.toxiproxy.reset_peer(link, after_ms=int(params.get("after_ms", 0)), stream=stream)
                else:
                    name = self.toxiproxy.latency(link, ms=int(params.get("ms", 500)),
                                                  jitter_ms=int(params.get("jitter_ms", 0)), stream=stream)
            except BaseException:
                self.in_force.pop(entry["key"], None)
                raise
            entry["toxic"] = name
        self._watch()
        return name

    def remove(self, service: str, kind: str, toxic_name: str | None, role: str | None = None) -> None:
        link = f"{service}@{role}" if role else service
        with self.lock:
            entry = self._entry_of(link, kind, toxic_name)
            if entry is not None:
                self._check([entry], when="at removal")  # once more, just before the harness undoes it
                self.in_force.pop(entry["key"], None)
            try:
                if kind == "cut":
                    if not any(e["link"] == link and e["kind"] == "cut" for e in self.in_force.values()):
                        self.toxiproxy.restore(link)
                elif toxic_name:
                    self.toxiproxy.remove_toxic(link, toxic_name)
            except Exception:
                # Gone already: someone else removed it (recorded as tampering), or the heal came first.
                if entry is None or not entry["changed"]:
                    raise
            finally:
                if entry is not None:
                    self._conclude(entry)
        self.history.append("fault", action="toxic", toxic=kind, phase="end", service=service,
                            **({"role": role} if role else {}),
                            **({"fault": entry["fault"]} if entry is not None and entry.get("fault") is not None
                               else {}))

    # --- verification ---------------------------------------------------------------------------------
    def _expect(self, link: str, kind: str, fault: int | None, params: dict) -> dict:
        self._next += 1
        expect: dict = {"enabled": False} if kind == "cut" else {}
        if kind != "cut":
            type_, attributes = _TOXIC[kind]
            expect = {"toxic": {"type": type_, "stream": params.get("stream", "downstream"), "toxicity": 1.0,
                                "attributes": attributes(params)}}
        entry = {"key": self._next, "link": link, "kind": kind, "fault": fault, "toxic": None, "expect": expect,
                 "checks": 0, "unread": 0, "changed": [], "seen": set(), "address": None, "began": time.monotonic()}
        self.in_force[entry["key"]] = entry
        return entry

    def _entry_of(self, link: str, kind: str, toxic_name: str | None) -> dict | None:
        fault = fault_index()
        mine = [e for e in self.in_force.values() if e["link"] == link and e["kind"] == kind
                and (kind == "cut" or e["toxic"] == toxic_name)]
        return next((e for e in mine if e["fault"] == fault), mine[0] if mine else None)

    def _watch(self) -> None:
        with self.lock:
            if self._watcher is not None and self._watcher.is_alive():
                return
            self._watcher = threading.Thread(target=self._watch_loop, name="tamper-watch", daemon=True)
            self._watcher.start()

    def _watch_loop(self) -> None:
        while True:
            time.sleep(self.verify_every)
            with self.lock:
                entries = [e for e in self.in_force.values() if e["toxic"] is not None or e["kind"] == "cut"]
                if not self.in_force:
                    self._watcher = None
                    return
                try:
                    self._check(entries, when="in force")
                except ValueError:  # the run closed its history (aborted before its heal): nothing left to watch
                    self._watcher = None
                    return

    def _check(self, entries: list[dict], when: str) -> None:
        """Read this run's proxies once and compare each entry's link with what the harness set (lock held)."""
        try:
            states = self.toxiproxy.states()
        except Exception as exc:  # Toxiproxy did not answer: this check proves nothing either way
            for entry in entries:
                entry["unread"] += 1
                entry.setdefault("read_error", repr(exc))
            return
        for entry in entries:
            entry["checks"] += 1
            state = states.get(entry["link"], "unknown link")
            for what, expected, found in self._differences(entry, state, entries):
                if what in entry["seen"]:
                    continue
                entry["seen"].add(what)
                entry["changed"].append(what)
                self.history.append("tamper", found="changed", fault=entry["fault"], link=entry["link"],
                                    kind=entry["kind"], what=what, expected=expected, observed=found, when=when,
                                    in_force_seconds=round(time.monotonic() - entry["began"], 3))

    def _differences(self, entry: dict, state, entries: list[dict]):
        if state == "unknown link":
            return
        if state is None:
            yield "proxy deleted", {"proxy": entry["link"]}, None
            return
        address = (state.get("listen"), state.get("upstream"))
        if entry["address"] is None:
            entry["address"] = address  # the first read of its proxy while the fault is in force
        elif address != entry["address"]:
            yield "proxy moved", {"listen": entry["address"][0], "upstream": entry["address"][1]}, \
                {"listen": address[0], "upstream": address[1]}
        faults_on_link = [e for e in self.in_force.values() if e["link"] == entry["link"]]
        if entry["kind"] == "cut":
            if state.get("enabled"):
                yield "proxy re-enabled", {"enabled": False}, {"enabled": True}
            elif probe_refused(state.get("listen")) is False:
                yield "connection through the cut proxy accepted", {"connect": "refused"}, \
                    {"connect": "accepted", "listen": state.get("listen")}
        else:
            want = entry["expect"]["toxic"]
            have = (state.get("toxics") or {}).get(entry["toxic"])
            if have is None:
                yield "toxic deleted", {entry["toxic"]: want}, {"toxics": sorted(state.get("toxics") or {})}
            else:
                differ = [k for k in ("type", "stream") if have.get(k) != want[k]]
                if float(have.get("toxicity", 1.0)) != want["toxicity"]:
                    differ.append("toxicity")
                attrs = have.get("attributes") or {}
                differ += [f"attributes.{k}" for k, v in want["attributes"].items() if _number(attrs.get(k)) != v]
                if differ:
                    yield "toxic changed", {entry["toxic"]: want}, {entry["toxic"]: have, "differs": differ}
            if not any(e["kind"] == "cut" for e in faults_on_link) and not state.get("enabled", True):
                yield "proxy disabled", {"enabled": True}, {"enabled": False}
        ours = {e["toxic"] for e in faults_on_link if e["toxic"]}
        extra = sorted(set(state.get("toxics") or {}) - ours)
        if extra:
            yield "toxic added", {"toxics": sorted(ours)}, {"toxics": sorted(state.get("toxics") or {})}

    def _conclude(self, entry: dict, when: str = "removed") -> None:
        found = "changed" if entry["changed"] else ("intact" if entry["checks"] else "unread")
        self.history.append("tamper", found=found, summary=True, fault=entry["fault"], link=entry["link"],
                            kind=entry["kind"], checks=entry["checks"], unread=entry["unread"],
                            changes=list(entry["changed"]), ended=when,
                            in_force_seconds=round(time.monotonic() - entry["began"], 3),
                            **({"read_error": entry["read_error"]} if entry.get("read_error") else {}))

    def verify_at_heal(self) -> int:
        """The heal phase, before it resets the proxies: check every fault still in force once more, conclude
        it, and stop expecting it (the reset is the harness's own change). Returns how many were in force."""
        with self.lock:
            entries = list(self.in_force.values())
            if entries:
                self._check(entries, when="at heal")
            for entry in entries:
                self._conclude(entry, when="at heal")
            self.in_force.clear()
        return len(entries)


def _number(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return value
