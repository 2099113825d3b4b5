"""Reading the roles' Prometheus metrics from outside (the seeds ask for an expiry metric of its own, BE-JOB-005).

The adapter says where: the ``[http]`` role serves ``/metrics`` on its HTTP port (the contract), and ``[metrics]``
names the other roles that serve it and the variables that give each instance its listener, with
``{metrics_port}`` standing for a free loopback port the harness picks per instance. ``[expiry] metric`` names the
counter of expired jobs. After the drain the harness reads every such endpoint once and records one ``metrics``
event per instance in the history; checkers read those events, never the endpoints.
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from . import http_clients

PORT_PLACEHOLDER = "{metrics_port}"
READ_TIMEOUT_SECONDS = 3.0


def instance_env(template: dict[str, str], port: int) -> dict[str, str]:
    """The [metrics] env of one instance, its placeholder replaced by the port picked for it."""
    return {name: str(value).replace(PORT_PLACEHOLDER, str(port)) for name, value in template.items()}


_SELECTOR = re.compile(r'^\s*(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(?P<labels>[^}]*)\})?\s*$')
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def selector(spec: str) -> tuple[str, dict[str, str]] | None:
    """``name`` or ``name{label="value",...}`` (equality matchers only) -> (name, labels); None if malformed."""
    match = _SELECTOR.match(spec or "")
    if not match:
        return None
    labels, rest = {}, (match.group("labels") or "").strip()
    while rest:
        m = _MATCHER.match(rest)
        if not m:
            return None
        labels[m.group(1)] = m.group(2)
        rest = rest[m.end():].strip()
    return match.group("name"), labels


def totals(text: str, names: set[str]) -> dict[str, float]:
    """Each named metric summed over its label sets (a counter's ``_total`` sample; ``_created`` is ignored). A name
    may carry a label selector, ``jobs_total{outcome="expired"}``: only the samples with those labels count."""
    wanted = {spec: selector(spec) for spec in names}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for spec, parsed in wanted.items():
                if parsed is None:
                    continue
                name, labels = parsed
                if not (sample.name == name or (family.name == name and sample.name == family.name + "_total")):
                    continue
                if all(sample.labels.get(k) == v for k, v in labels.items()):
                    out[spec] = out.get(spec, 0.0) + float(sample.value)
    return out


def read(url: str, names: set[str]) -> dict:
    """One read of a /metrics endpoint: the named totals, or the error that kept them from being read."""
    try:
        answer = http_clients.get(url, timeout=READ_TIMEOUT_SECONDS)
        answer.raise_for_status()
        return {"ok": True, "values": totals(answer.text, names)}
    except Exception as exc:  # recorded, never raised: a role without its metrics makes a check unknown, not a crash
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "values": {}}
