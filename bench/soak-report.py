#!/usr/bin/env python3
"""Turns the soak's JSON (bench/soak) into a report with verdicts and an SVG time series
(standard library only). Exits non-zero when a verdict about data (lost, errors) fails."""
import json
import sys

soak_path, report_path, chart_path = sys.argv[1:4]
soak = json.load(open(soak_path))
run = soak.get("run", {})
intervals = soak["intervals"]
minutes = [i["end_s"] / 60 for i in intervals]

E2E_P99_MS = 50.0
ANSWER_P99_MS = 20.0
RSS_GROWTH = 0.10
WAL_PER_EVENT = 4096


def rss_growth(key):
    """RSS growth from the fifth interval (or the first, in a short run) to the last."""
    values = [i[key] for i in intervals if i.get(key)]
    if len(values) < 2:
        return None
    start = values[min(4, len(values) - 2)]
    return (values[-1] - start) / start


worst_e2e = max((i["end_to_end"]["p99_ms"] for i in intervals), default=0.0)
worst_answer = max((i["answer"]["p99_ms"] for i in intervals), default=0.0)
growth = {name: rss_growth(f"{name}_rss_kib") for name in ("receiver", "worker")}
ledger = run.get("ledger", {})
checks = [
    (soak["lost"] == 0 and soak["not_done"] == 0,
     f"nothing lost: {soak['acked']:,} acknowledged, {soak['lost']} without a finished row, "
     f"{soak['not_done']} finished other than done"),
    (soak["failed"] == 0, f"no error answers: {soak['failed']} of {soak['sent']:,} sent"),
    (not ledger or (ledger.get("lines") == ledger.get("events") == soak["acked"]),
     f"one business effect each: {ledger.get('lines', '?'):,} ledger lines for "
     f"{ledger.get('events', '?'):,} events" if ledger else "ledger not read"),
]
data_ok = all(ok for ok, _ in checks)
checks += [
    (worst_e2e < E2E_P99_MS, f"end to end p99 < {E2E_P99_MS:.0f} ms in every interval: worst {worst_e2e:.1f} ms"),
    (worst_answer < ANSWER_P99_MS, f"answer p99 < {ANSWER_P99_MS:.0f} ms in every interval: worst {worst_answer:.1f} ms"),
]
for name, g in growth.items():
    if g is not None:
        checks.append((g < RSS_GROWTH, f"{name} RSS growth < {RSS_GROWTH:.0%} from minute 5 to the end: {g:+.1%}"))
checks.append((soak["wal_bytes_per_event"] <= WAL_PER_EVENT,
               f"WAL per event ≤ {WAL_PER_EVENT} bytes ({soak['body_bytes']} B bodies, everything the database wrote): "
               f"{soak['wal_bytes_per_event']:,.0f} bytes"))

lines = []
w = lines.append
machine = run.get("machine", {})
w("# webhook-inbox soak report")
w("")
capacity = run.get("capacity_per_second")
w(f"Sent {soak['sent']:,} signed webhooks ({soak['body_bytes']} B JSON bodies) at {soak['rate']:,}/s for "
  f"{soak['seconds'] / 60:.0f} minutes through the receiver to the worker (demo handler, default flags); "
  f"sampled every {soak['interval_seconds']:.0f} s. Machine: {machine.get('cpus')} CPUs "
  f"({machine.get('cpu_model')}), everything on it; run {machine.get('date')}.")
w("")
if capacity:
    w(f"The rate is {run.get('share_percent')} % of the capacity measured first: {capacity:,}/s, the highest "
      f"steady (open-loop) rate the whole pipeline sustained on these cores, in steps that had to drain within "
      f"2 s of their last send and answer within 1 s at p99. Under closed loop, where both sides batch more "
      f"than a steady flow lets them, the worker drained a prefilled backlog at "
      f"{run.get('drain_capacity_per_second') or 0:,}/s and ingest with 64 connections while the worker drained "
      f"ran at {run.get('pipeline_capacity_per_second') or 0:,}/s.")
else:
    w("The rate was given (`SOAK_RATE`), not measured.")
w("")
settings = run.get("settings", {})
w(f"Database: {run.get('database')}; " + ", ".join(f"`{k}={v}`" for k, v in sorted(settings.items())) + ".")
os_settings = run.get("os_settings")
if os_settings:
    w("")
    w("Kernel page-cache writeback on the database host: "
      + ", ".join(f"`{k}={v}`" for k, v in sorted(os_settings.items())) + ".")
w("")
w("Reproduce: `make soak` (`SOAK_MINUTES`, `SOAK_SHARE`, `SOAK_RATE`, `SOAK_PROFILE`; see `bench/soak`).")
w("")
w("## Verdicts")
w("")
for ok, text in checks:
    w(f"- {'met' if ok else '**missed**'}: {text}")
w(f"- the backlog drained {soak['drained_seconds_after_last_send']:.1f} s after the last send")
cpu = soak.get("cpu_ms_per_event", {})
if cpu:
    w(f"- CPU per event: receiver {cpu['receiver']:.3f} ms, worker {cpu['worker']:.3f} ms, "
      f"PostgreSQL {cpu['database']:.3f} ms (and the load generator {cpu['load']:.3f} ms), "
      f"on {machine.get('cpus')} cores shared by all four")
inside = [i["receiver_within_20ms"] for i in intervals if i.get("receiver_within_20ms") is not None]
if inside:
    w(f"- inside the receiver (from a request's arrival in its handler to its answer, its own histogram), "
      f"answers within 20 ms: at least {min(inside):.2%} in every interval, so its p99 is "
      f"{'under' if min(inside) >= 0.99 else 'over'} 20 ms in {'every' if min(inside) >= 0.99 else 'some'} "
      f"interval; the answer p99 above is the load generator's, from the time each request was due to the "
      f"answer read, on the cores it shares with the receiver, the worker and PostgreSQL")
w("")
w("![per-interval series](chart.svg)")
w("")
w("## Per interval")
w("")
w("| min | acked/s | processed/s | failed | answer p99 ms | e2e p50 ms | e2e p99 ms | e2e max ms | backlog | receiver ≤ 20 ms | receiver MiB | worker MiB | WAL MB | FPI | checkpoints | autovacuum |")
w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for i, m in zip(intervals, minutes):
    mib = lambda kib: f"{kib / 1024:.0f}" if kib else "-"
    processed = "-" if i["processed_per_s"] is None else f"{i['processed_per_s']:,.0f}"
    within = "-" if i.get("receiver_within_20ms") is None else f"{i['receiver_within_20ms']:.2%}"
    w(f"| {m:.0f} | {i['acked_per_s']:,.0f} | {processed} | {i['failed']} | {i['answer']['p99_ms']:.1f} | "
      f"{i['end_to_end']['p50_ms']:.1f} | {i['end_to_end']['p99_ms']:.1f} | {i['end_to_end']['max_ms']:.0f} | "
      f"{i['backlog']:,} | {within} | {mib(i['receiver_rss_kib'])} | {mib(i['worker_rss_kib'])} | "
      f"{i['wal_bytes'] / 1e6:,.0f} | {i['wal_full_page_images']:,} | "
      f"{i['checkpoints_timed']}+{i['checkpoints_requested']} | {i['autovacuums']} |")
w("")
w("Checkpoints are counted as timed+requested (requested: `max_wal_size` reached). FPI: full-page "
  "images written to the WAL, the first change of each page after a checkpoint.")
w("")
w("Slowest seconds (end to end, by second of acknowledgement):")
w("")
for s in soak.get("worst_seconds", [])[:5]:
    w(f"- second {s['second']}: {s['end_to_end_ms']:.0f} ms")
open(report_path, "w").write("\n".join(lines) + "\n")

# Four stacked panels sharing the time axis.
width, panel_h, left, top = 900, 150, 70, 30
panels = [
    ("end to end and answer p99 (ms)", [("e2e p99", [i["end_to_end"]["p99_ms"] for i in intervals], "#c0392b"),
                                         ("answer p99", [i["answer"]["p99_ms"] for i in intervals], "#2980b9")],
     E2E_P99_MS),
    ("webhooks/s", [("acked", [i["acked_per_s"] for i in intervals], "#27ae60"),
                    ("processed", [i["processed_per_s"] or 0 for i in intervals], "#8e44ad")], None),
    ("RSS (MiB)", [("receiver", [(i["receiver_rss_kib"] or 0) / 1024 for i in intervals], "#d35400"),
                   ("worker", [(i["worker_rss_kib"] or 0) / 1024 for i in intervals], "#16a085")], None),
    ("WAL per interval (MB)", [("WAL", [i["wal_bytes"] / 1e6 for i in intervals], "#7f8c8d")], None),
]
height = top + len(panels) * (panel_h + 50) + 20
plot_w = width - left - 150
xmax = max(minutes, default=1) or 1
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
       '<rect width="100%" height="100%" fill="white"/>']
checkpoint_minutes = [m for i, m in zip(intervals, minutes) if i["checkpoints_timed"] + i["checkpoints_requested"]]
for n, (title, series, limit) in enumerate(panels):
    y0 = top + n * (panel_h + 50)
    ymax = max([v for _, values, _ in series for v in values] + [limit or 0, 1e-9]) * 1.1
    svg.append(f'<text x="{left}" y="{y0 - 10}" font-weight="bold">{title}</text>')
    svg.append(f'<line x1="{left}" y1="{y0 + panel_h}" x2="{left + plot_w}" y2="{y0 + panel_h}" stroke="black"/>')
    svg.append(f'<line x1="{left}" y1="{y0}" x2="{left}" y2="{y0 + panel_h}" stroke="black"/>')
    for frac in (0, 0.5, 1):
        y = y0 + panel_h - frac * panel_h
        svg.append(f'<text x="{left - 5}" y="{y + 4:.0f}" text-anchor="end">{ymax * frac:,.0f}</text>')
    for m in checkpoint_minutes:
        x = left + m / xmax * plot_w
        svg.append(f'<line x1="{x:.0f}" y1="{y0}" x2="{x:.0f}" y2="{y0 + panel_h}" stroke="#bbb" stroke-dasharray="2"/>')
    if limit:
        y = y0 + panel_h - limit / ymax * panel_h
        svg.append(f'<line x1="{left}" y1="{y:.0f}" x2="{left + plot_w}" y2="{y:.0f}" stroke="gray" stroke-dasharray="6"/>')
        svg.append(f'<text x="{left + plot_w - 2}" y="{y - 4:.0f}" text-anchor="end" fill="gray">target {limit:.0f} ms</text>')
    for k, (label, values, colour) in enumerate(series):
        points = " ".join(f"{left + m / xmax * plot_w:.1f},{y0 + panel_h - v / ymax * panel_h:.1f}"
                          for m, v in zip(minutes, values))
        svg.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        svg.append(f'<text x="{left + plot_w + 10}" y="{y0 + 15 + 16 * k}" fill="{colour}">{label}</text>')
    svg.append(f'<text x="{left + plot_w / 2:.0f}" y="{y0 + panel_h + 28}" text-anchor="middle">minutes '
               '(dotted: an interval with a checkpoint)</text>')
svg.append("</svg>")
open(chart_path, "w").write("\n".join(svg) + "\n")
sys.exit(0 if data_ok else 1)
