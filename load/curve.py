"""Pure parts of the prefetch load curve (BE-JOB-004 under a large backlog): ticks, per-prefetch summaries, the
checks, CSV and the page. No I/O besides writing the files it is given; load/prefetch_curve.py does the run.

A tick is one sample taken while a backlog drains: every consumer channel's prefetch and unacked count (RabbitMQ
management API), the work queue's ready / unacked / acknowledged counts, and the resident memory of the consumer
roles (their whole process groups, from /proc).
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

RSS_RATIO_LIMIT = 1.2
RATE_WINDOW_SECONDS = 5.0
TICK_FIELDS = ("prefetch", "t", "ready", "unacked", "acked", "finished", "jobs_per_s", "rss_kib", "consumers",
               "max_unacked_per_consumer", "consumer_prefetch", "per_consumer")
SUMMARY_FIELDS = ("prefetch", "backlog", "drained", "drain_seconds", "jobs_per_s", "peak_jobs_per_s", "samples",
                  "consumer_samples", "max_unacked", "consumer_prefetch", "rss_first_kib", "rss_last_kib",
                  "rss_max_kib", "rss_ratio", "upload_seconds", "uploads_per_s", "error")


@dataclass
class Tick:
    prefetch: int                 # the prefetch asked for through the adapter's prefetch variable
    t: float                      # seconds since the consumers were released
    ready: int | None             # work queue messages ready (management API)
    unacked: int | None           # work queue messages unacknowledged, all consumers
    acked: int | None             # jobs finished: backlog - ready (exact) - unacked, never decreasing
    rss_kib: int                  # resident memory of every process of every consumer role
    channels: dict[str, tuple[int, int]] = field(default_factory=dict)  # channel -> (its prefetch, its unacked)
    finished: int | None = None   # jobs finished so far (acked), filled by rates()
    jobs_per_s: float | None = None

    @property
    def max_unacked(self) -> int:
        return max((u for _, u in self.channels.values()), default=0)

    @property
    def consumer_prefetch(self) -> int | None:
        return max((p for p, _ in self.channels.values()), default=None)


def rates(ticks: list[Tick], window: float = RATE_WINDOW_SECONDS) -> list[Tick]:
    """Fill each tick's ``finished`` (acked so far) and ``jobs_per_s`` (acks over the last ``window`` seconds)."""
    known = [(k.t, k.acked) for k in ticks if k.acked is not None]
    j = 0
    for k in ticks:
        k.finished = k.acked
        if k.acked is None:
            continue
        while j < len(known) and known[j][0] < k.t - window:
            j += 1
        t0, a0 = known[j] if j < len(known) else (k.t, k.acked)
        k.jobs_per_s = round((k.acked - a0) / (k.t - t0), 2) if k.t > t0 else None
    return ticks


def rss_reference(ticks: list[Tick]) -> tuple[int | None, int | None]:
    """(first, last) RSS: first is the first sample once a job finished (the roles are warm: pools started, code
    loaded), last the last sample with the roles still running."""
    warm = [k.rss_kib for k in ticks if k.rss_kib and (k.acked or 0) > 0]
    if not warm:
        warm = [k.rss_kib for k in ticks if k.rss_kib]
    return (warm[0], warm[-1]) if warm else (None, None)


def summarize(prefetch: int, ticks: list[Tick], backlog: int, drained: bool, drain_seconds: float | None,
              upload_seconds: float | None = None) -> dict:
    rates(ticks)
    first, last = rss_reference(ticks)
    peak = max((k.jobs_per_s for k in ticks if k.jobs_per_s is not None), default=None)
    channels = [u for k in ticks for u in k.channels.values()]
    prefetches = [p for p, _ in channels]
    return {
        "prefetch": prefetch, "backlog": backlog, "drained": bool(drained),
        "drain_seconds": None if drain_seconds is None else round(drain_seconds, 1),
        "jobs_per_s": round(backlog / drain_seconds, 2) if drained and drain_seconds else None,
        "peak_jobs_per_s": peak, "samples": len(ticks), "consumer_samples": len(channels),
        "max_unacked": max((u for _, u in channels), default=None),
        "consumer_prefetch": max(prefetches) if prefetches else None,
        "rss_first_kib": first, "rss_last_kib": last,
        "rss_max_kib": max((k.rss_kib for k in ticks), default=None),
        "rss_ratio": round(last / first, 3) if first and last else None,
        "upload_seconds": None if upload_seconds is None else round(upload_seconds, 1),
        "uploads_per_s": round(backlog / upload_seconds, 1) if upload_seconds else None,
    }


def checks(summaries: list[dict], ticks: dict[int, list[Tick]]) -> list[dict]:
    """Per prefetch: unacked ≤ prefetch at every consumer sample (and the consumers really ran with that prefetch),
    RSS last/first ≤ RSS_RATIO_LIMIT, and a throughput (the backlog drained). Status pass / fail / unknown."""
    out = []
    for s in summaries:
        p = s["prefetch"]
        if s.get("error"):
            out += [{"check": name, "prefetch": p, "status": "unknown", "detail": f"not measured: {s['error']}"}
                    for name in ("unacked_within_prefetch", "rss_flat", "throughput")]
            continue
        samples = [(ch, pf, un) for k in ticks.get(p, []) for ch, (pf, un) in k.channels.items()]
        over = [(ch, pf, un) for ch, pf, un in samples if pf == 0 or un > pf or un > p or pf > p]
        if not samples:
            status, why = "unknown", "no consumer channel was sampled"
        elif over:
            ch, pf, un = over[0]
            status, why = "fail", f"{len(over)} samples over the limit; first: {ch} unacked {un}, prefetch {pf}"
        else:
            status, why = "pass", f"max unacked {s['max_unacked']} ≤ prefetch {p} over {len(samples)} consumer samples"
        out.append({"check": "unacked_within_prefetch", "prefetch": p, "status": status, "detail": why})
        ratio = s.get("rss_ratio")
        if ratio is None:
            out.append({"check": "rss_flat", "prefetch": p, "status": "unknown",
                        "detail": "no resident memory was sampled"})
        else:
            out.append({"check": "rss_flat", "prefetch": p, "status": "pass" if ratio <= RSS_RATIO_LIMIT else "fail",
                        "detail": f"last/first {ratio} (limit {RSS_RATIO_LIMIT}): {s['rss_first_kib']} → "
                                  f"{s['rss_last_kib']} KiB"})
        if s["drained"] and s.get("jobs_per_s"):
            out.append({"check": "throughput", "prefetch": p, "status": "pass",
                        "detail": f"{s['jobs_per_s']} jobs/s ({s['backlog']} in {s['drain_seconds']} s)"})
        else:
            out.append({"check": "throughput", "prefetch": p, "status": "fail",
                        "detail": f"backlog of {s['backlog']} did not drain"})
    return out


def tick_rows(ticks: list[Tick]) -> list[dict]:
    rates(ticks)
    return [{"prefetch": k.prefetch, "t": round(k.t, 2), "ready": k.ready, "unacked": k.unacked, "acked": k.acked,
             "finished": k.finished, "jobs_per_s": k.jobs_per_s, "rss_kib": k.rss_kib, "consumers": len(k.channels),
             "max_unacked_per_consumer": k.max_unacked, "consumer_prefetch": k.consumer_prefetch,
             "per_consumer": ";".join(f"{c}={u}/{p}" for c, (p, u) in sorted(k.channels.items()))}
            for k in ticks]


def to_csv(rows: list[dict], fields: tuple[str, ...]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(fields), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    return out.getvalue()


def verdict(check_rows: list[dict]) -> str:
    statuses = {c["status"] for c in check_rows}
    return "fail" if "fail" in statuses else "unknown" if "unknown" in statuses or not statuses else "pass"


def page_markdown(meta: dict, summaries: list[dict], check_rows: list[dict]) -> str:
    lines = [f"# Prefetch load curve — {meta.get('sut')}", "",
             f"seed {meta.get('seed')}; backlog {meta.get('backlog')} per prefetch; images: {meta.get('images')}; "
             f"prefetch variable `{meta.get('prefetch_env')}`; consumers {', '.join(meta.get('consumers') or [])}; "
             f"verdict **{verdict(check_rows).upper()}**.", "",
             "Machine: " + str(meta.get("machine", "")), "",
             "![prefetch curve](curve.svg)", "",
             "| prefetch | drained | drain s | jobs/s | peak jobs/s (5 s) | max unacked / consumer | RSS first→last KiB "
             "| RSS ratio | uploads/s |", "|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        lines.append(f"| {s['prefetch']} | {s['drained']} | {s['drain_seconds']} | {s['jobs_per_s']} | "
                     f"{s['peak_jobs_per_s']} | {s['max_unacked']} | {s['rss_first_kib']}→{s['rss_last_kib']} | "
                     f"{s['rss_ratio']} | {s['uploads_per_s']} |")
    lines += [f"- prefetch {s['prefetch']} not measured: {s['error']}" for s in summaries if s.get("error")]
    if meta.get("env_overrides"):
        lines += ["", f"Variables set on top of the adapter's [env]: {meta['env_overrides']}"]
    lines += ["", "| check | prefetch | status | detail |", "|---|---|---|---|"]
    lines += [f"| {c['check']} | {c['prefetch']} | {c['status']} | {c['detail']} |" for c in check_rows]
    lines += ["", "Files: samples.csv (every tick), summary.csv, checks.json, curve.svg, curve.png.",
              "Throughput is jobs finished per second: deliveries out of the work queue and no longer unacknowledged "
              "(backlog − ready by a passive declare − unacked by the management API); drain time runs from "
              "the consumers' start to an empty work queue (ready + unacked = 0). RSS first is the first sample "
              "after a job finished (roles warm), last the last sample before the roles stop.", ""]
    return "\n".join(lines)


def page_html(markdown_text: str, svg: str) -> str:
    """A self-contained HTML page: the SVG inline, the tables as preformatted Markdown."""
    import html

    body = markdown_text.replace("![prefetch curve](curve.svg)", "@@SVG@@")
    escaped = html.escape(body).replace("@@SVG@@", "</pre>" + svg + "<pre>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>prefetch curve</title>"
            "<style>body{font-family:sans-serif;margin:1em}pre{white-space:pre-wrap}</style></head><body><pre>"
            + escaped + "</pre></body></html>")
