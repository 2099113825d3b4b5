"""reference/README.md lists every setting with its default (issue 23 "Must show"): the settings table names exactly
the fields of reference/settings.py's Settings, no more, no fewer, each once; and the README names the metrics the
roles register, the health endpoints and what is validated at start-up."""

from __future__ import annotations

import re
from pathlib import Path

from reference.settings import Settings

README = Path(__file__).resolve().parents[3] / "reference" / "README.md"


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def settings_table_names() -> list[str]:
    names = []
    for line in section("Settings").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or set(cells[0]) <= {"-", " "} or cells[0] == "variable":
            continue
        assert cells[1], f"{cells[0]}: no default"
        names += re.findall(r"`([A-Z0-9_]+)`", cells[0])
    return names


def test_the_settings_table_lists_exactly_the_settings_fields():
    listed = settings_table_names()
    fields = {name.upper() for name in Settings.model_fields}
    assert len(listed) == len(set(listed)), sorted(n for n in listed if listed.count(n) > 1)
    assert set(listed) - fields == set(), "listed in reference/README.md but not a setting"
    assert fields - set(listed) == set(), "settings missing from reference/README.md's table"


def test_every_metric_of_the_roles_is_named_in_the_readme():
    from prometheus_client.metrics import MetricWrapperBase

    from reference import metrics

    text = section("Observability")
    names = {m._name for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)}
    assert len(names) >= 10
    missing = sorted(n for n in names if not re.search(rf"`{re.escape(n)}(_total)?[`{{]", text))
    assert missing == []


def test_the_health_endpoints_and_the_start_up_checks_are_described():
    text = section("Observability")
    assert "`GET /healthz`" in text
    checks = section("Validated at start-up")
    for setting in ("MAX_ATTEMPTS", "DELIVERY_LIMIT", "PREFETCH", "WORKER_CONCURRENCY", "AMQP_HEARTBEAT_SECONDS",
                    "MAX_REPLAYS", "LEASE_RENEW_SECONDS", "WORKER_BATCH_SIZE", "FAILPOINTS", "LEVEL"):
        assert f"`{setting}`" in checks, setting
