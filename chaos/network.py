"""Network faults through Toxiproxy: cut, blackhole, reset_peer and latency on postgres, rabbitmq or s3."""

from __future__ import annotations

KINDS = ("cut", "blackhole", "reset_peer", "latency")


class NetworkFaults:
    def __init__(self, toxiproxy, history):
        self.toxiproxy = toxiproxy
        self.history = history

    def apply(self, service: str, kind: str, params: dict | None = None, role: str | None = None) -> str | None:
        """Start a fault; returns the toxic name (None for cut, which disables the proxy). With ``role``: on that
        role's own link to the service (a proxy the runner gave it), not on every role's."""
        params = dict(params or {})
        self.history.append("fault", action="toxic", toxic=kind, phase="start", service=service, params=params,
                            **({"role": role} if role else {}))
        service = f"{service}@{role}" if role else service
        if kind == "cut":
            self.toxiproxy.cut(service)
            return None
        if kind == "blackhole":
            return self.toxiproxy.blackhole(service, stream=params.get("stream", "downstream"))
        if kind == "reset_peer":
            return self.toxiproxy.reset_peer(service, after_ms=int(params.get("after_ms", 0)),
                                             stream=params.get("stream", "downstream"))
        if kind == "latency":
            return self.toxiproxy.latency(service, ms=int(params.get("ms", 500)),
                                          jitter_ms=int(params.get("jitter_ms", 0)),
                                          stream=params.get("stream", "downstream"))
        raise ValueError(f"unknown network fault {kind!r}; one of {KINDS}")

    def remove(self, service: str, kind: str, toxic_name: str | None, role: str | None = None) -> None:
        link = f"{service}@{role}" if role else service
        if kind == "cut":
            self.toxiproxy.restore(link)
        elif toxic_name:
            self.toxiproxy.remove_toxic(link, toxic_name)
        self.history.append("fault", action="toxic", toxic=kind, phase="end", service=service,
                            **({"role": role} if role else {}))
