#!/usr/bin/env python3
"""Turns bench/out/results.jsonl into bench/report.md and an SVG chart (standard library only)."""
import json
import sys

results_path, report_path, chart_path = sys.argv[1:4]
rows = [json.loads(line) for line in open(results_path) if line.strip()]


def of(phase):
    return [r for r in rows if r["phase"] == phase]


machine = (of("machine") or [{}])[0]
settings = (of("settings") or [{}])[0]
ceiling_one = of("ceiling_insert_one")
best_one = max((r["per_second"] for r in ceiling_one), default=0.0)
ceiling_64 = (of("ceiling_insert_64") or [{"per_second": 0}])[0]["per_second"]
ceiling_claim = (of("ceiling_claim_complete_100") or [{"per_second": 0}])[0]["per_second"]
ceiling_one_table = (of("ceiling_claim_complete_100_one_table") or [{"per_second": 0}])[0]["per_second"]
ingest = of("ingest")
by_mode = {}
for r in ingest:
    by_mode.setdefault(r["mode"], []).append(r)
best = {mode: max(runs, key=lambda r: r["result"]["per_second"]) for mode, runs in by_mode.items()}
half = (of("ingest_half_ceiling") or [{"result": {}}])[0]["result"]
drain = {r["handler"]: r for r in of("drain")}
e2e = (of("end_to_end") or [{"result": {}}])[0]["result"]
memory = of("memory")
by_scheme = {r["scheme"]: r for r in of("ingest_by_scheme")}
ordering_drains = {r["label"]: r["result"] for r in of("drain_ordering")}
ingest_variants = of("ingest_variant")


def verdict(ok, text):
    return ("met" if ok else "**missed**") + f": {text}"


lines = []
w = lines.append
w("# webhook-inbox benchmark report")
w("")
w(f"Machine: {machine.get('cpus')} CPUs ({machine.get('cpu_model')}), {machine.get('memory_gib')} GiB; "
  f"PostgreSQL {machine.get('postgres')} on the same machine (durable commits: fsync and "
  f"synchronous_commit on); run {machine.get('date')}. Everything (load generator, receiver, worker, "
  "database) shares the same cores, so only ratios from this one run are meaningful.")
w("")
w(f"Settings: receiver `{settings.get('receiver', '')}` (otherwise defaults: group commit with 1 writer, "
  f"batches up to 256); worker `{settings.get('worker', '')}`; {settings.get('seconds_per_run')} s per measured run "
  "after a 2 s warm-up; before every run the tables are emptied, vacuumed and checkpointed; PostgreSQL profile "
  "`bench` of `scripts/local-postgres`.")
w("")
w("Reproduce: `make bench` (about 8 minutes once the release build is done; `BENCH_SECONDS`, `BENCH_CONCURRENCIES`, "
  "`BENCH_DRAIN_EVENTS` shorten or lengthen it).")
w("")
w("## Targets")
w("")
gc = best.get("group-commit", {"result": {"per_second": 0}, "concurrency": 0})
pr = best.get("per-request", {"result": {"per_second": 0}, "concurrency": 0})
gc_rate, pr_rate = gc["result"]["per_second"], pr["result"]["per_second"]
def drained(label):
    return drain.get(label, {"result": {"per_second": 0}})["result"]["per_second"]


def ratio(a, b):
    return a / b if b else 0


noop, demo = drained("no-op"), drained("demo")
noop_defaults, demo_defaults = drained("no-op-defaults"), drained("demo-defaults")
forward_now, forward_slow = drained("forward-0ms"), drained("forward-50ms")
# Forwards in flight at default flags: --concurrency 32 and a route's max_in_flight 32.
forward_concurrency = 32
forward_slow_target = 0.9 * forward_concurrency / 0.05
peak = {r["binary"]: r["peak_rss_kib"] / 1024 for r in memory}
w("| target | measured | verdict |")
w("|---|---|---|")
w(f"| ingest (group commit) >= 1.0x pgbench one-row ceiling | {gc_rate:,.0f}/s vs {best_one:,.0f}/s = {gc_rate / best_one if best_one else 0:.2f}x | "
  + verdict(gc_rate >= best_one, f"{gc_rate / best_one if best_one else 0:.2f}x") + " |")
w(f"| ingest p99 < 20 ms at half that ceiling ({half.get('rate', 0):,}/s) | p99 {half.get('answer_p99_ms', 0):.2f} ms | "
  + verdict(half.get("answer_p99_ms", 1e9) < 20, f"{half.get('answer_p99_ms', 0):.2f} ms") + " |")
w(f"| group commit >= 2x per-request | {gc_rate:,.0f}/s vs {pr_rate:,.0f}/s = {gc_rate / pr_rate if pr_rate else 0:.2f}x | "
  + verdict(pr_rate and gc_rate >= 2 * pr_rate, f"{gc_rate / pr_rate if pr_rate else 0:.2f}x") + " |")
w(f"| drain, no-op handler >= 0.8x claim+complete ceiling | {noop:,.0f}/s vs {ceiling_claim:,.0f}/s = {noop / ceiling_claim if ceiling_claim else 0:.2f}x | "
  + verdict(ceiling_claim and noop >= 0.8 * ceiling_claim, f"{noop / ceiling_claim if ceiling_claim else 0:.2f}x") + " |")
w(f"| drain, no-op handler >= 1.6x claim+complete ceiling of the one-table inbox | {noop:,.0f}/s vs {ceiling_one_table:,.0f}/s = {ratio(noop, ceiling_one_table):.2f}x | "
  + verdict(ceiling_one_table and noop >= 1.6 * ceiling_one_table, f"{ratio(noop, ceiling_one_table):.2f}x") + " |")
w(f"| drain, no-op handler at default flags >= 0.8x tuned | {noop_defaults:,.0f}/s vs {noop:,.0f}/s = {ratio(noop_defaults, noop):.2f}x | "
  + verdict(noop and noop_defaults >= 0.8 * noop, f"{ratio(noop_defaults, noop):.2f}x") + " |")
w(f"| drain, demo in-transaction handler >= 8,000/s | {demo:,.0f}/s | " + verdict(demo >= 8000, f"{demo:,.0f}/s") + " |")
w(f"| drain, demo >= 0.75x no-op | {demo:,.0f}/s vs {noop:,.0f}/s = {ratio(demo, noop):.2f}x | "
  + verdict(noop and demo >= 0.75 * noop, f"{ratio(demo, noop):.2f}x") + " |")
w(f"| forward drain, sink answering at once (default flags) | {forward_now:,.0f}/s ({ratio(forward_now, noop):.2f}x the no-op drain) | reported |")
w(f"| forward drain, sink answering after 50 ms >= 0.9 x {forward_concurrency} / 0.05 s = {forward_slow_target:,.0f}/s | {forward_slow:,.0f}/s | "
  + verdict(forward_slow >= forward_slow_target, f"{forward_slow:,.0f}/s") + " |")
if by_scheme:
    hmac_rate = by_scheme.get("hmac-sha256", {"result": {"per_second": 0}})["result"]["per_second"]
    ed_rate = by_scheme.get("standard-webhooks", {"result": {"per_second": 0}})["result"]["per_second"]
    w(f"| ingest with Ed25519 (Standard Webhooks v1a) beside HMAC-SHA256, group commit, 128 connections, same receiver | "
      f"{ed_rate:,.0f}/s vs {hmac_rate:,.0f}/s = {ed_rate / hmac_rate if hmac_rate else 0:.2f}x | reported (no target) |")
if ordering_drains:
    unordered = ordering_drains.get("unordered", {}).get("per_second", 0)
    keyed = ordering_drains.get("keys-10000", {}).get("per_second", 0)
    hot = ordering_drains.get("one-hot-key", {}).get("per_second", 0)
    w(f"| ordered drain over 10,000 keys >= 0.7x the same drain unordered | {keyed:,.0f}/s vs {unordered:,.0f}/s = {ratio(keyed, unordered):.2f}x | "
      + verdict(unordered and keyed >= 0.7 * unordered, f"{ratio(keyed, unordered):.2f}x") + " |")
    w(f"| one hot key >= 1,000 events/s, one at a time | {hot:,.0f}/s | " + verdict(hot >= 1000, f"{hot:,.0f}/s") + " |")
if ingest_variants:
    def mean_rate(provider):
        rates = [r["result"]["per_second"] for r in ingest_variants if r["provider"] == provider]
        return sum(rates) / len(rates) if rates else 0
    plain, keyed_ingest, guarded = mean_rate("demo"), mean_rate("bench-ordered"), mean_rate("bench-guarded")
    w(f"| ingest with an ordering key within 5 % of ingest without (128 connections, alternating runs, mean of {len(ingest_variants) // 3} each) | "
      f"{keyed_ingest:,.0f}/s vs {plain:,.0f}/s = {ratio(keyed_ingest, plain):.2f}x | "
      + verdict(plain and keyed_ingest >= 0.95 * plain, f"{ratio(keyed_ingest, plain):.2f}x") + " |")
    w(f"| ingest with replay suppression (id from a header) beside without, same runs | "
      f"{guarded:,.0f}/s vs {plain:,.0f}/s = {ratio(guarded, plain):.2f}x | reported |")
w(f"| end to end at 1,000/s: p50 < 5 ms, p99 < 50 ms | p50 {e2e.get('p50_ms', 0):.2f} ms, p99 {e2e.get('p99_ms', 0):.2f} ms | "
  + verdict(e2e.get("p50_ms", 1e9) < 5 and e2e.get("p99_ms", 1e9) < 50,
            f"p50 {e2e.get('p50_ms', 0):.2f} ms, p99 {e2e.get('p99_ms', 0):.2f} ms") + " |")
w(f"| each binary < 64 MiB RSS | " + ", ".join(f"{k}: {v:.1f} MiB" for k, v in peak.items()) + " | "
  + verdict(all(v < 64 for v in peak.values()), f"max {max(peak.values(), default=0):.1f} MiB") + " |")
w("")
w("## Ceilings: what the database itself does (pgbench, same schema, 1 KiB bodies)")
w("")
w("| script | clients | rows per second |")
w("|---|---|---|")
for r in ceiling_one:
    w(f"| one `INSERT ... ON CONFLICT DO NOTHING` per transaction | {r['clients']} | {r['per_second']:,.0f} |")
w(f"| 64-row `INSERT ... ON CONFLICT DO NOTHING` per transaction | 8 | {ceiling_64:,.0f} |")
w(f"| claim 100 queue rows (`FOR UPDATE SKIP LOCKED`, bodies read from the journal) + fenced completion, two commits | 4 | {ceiling_claim:,.0f} |")
w(f"| the same loop on the one-table inbox of migrations 1-4 (the reference: each claim and completion rewrote the row) | 4 | {ceiling_one_table:,.0f} |")
w("")
w("## Ingest: the real receiver (HMAC verification, JSON parsing, 1 KiB bodies), closed loop")
w("")
w("| mode | connections | accepted/s | p50 ms | p99 ms | p99.9 ms | receiver CPU s per 1,000 |")
w("|---|---|---|---|---|---|---|")
for r in ingest:
    res = r["result"]
    cpu_per_k = r["receiver_cpu_seconds"] / (res["accepted"] / 1000) if res["accepted"] else 0
    w(f"| {r['mode']} | {r['concurrency'] if 'concurrency' in r else res['concurrency']} | {res['per_second']:,.0f} | "
      f"{res['p50_ms']:.2f} | {res['p99_ms']:.2f} | {res['p999_ms']:.2f} | {cpu_per_k:.3f} |")
w("")
w(f"Open loop at half the one-row ceiling ({half.get('rate', 0):,}/s, group commit): "
  f"p50 {half.get('answer_p50_ms', 0):.2f} ms, p99 {half.get('answer_p99_ms', 0):.2f} ms, "
  f"p99.9 {half.get('answer_p999_ms', 0):.2f} ms; {half.get('acked', 0):,} acked, {half.get('failed', 0)} failed.")
w("")
w("## Drain: the real worker emptying a backlog")
w("")
w("Labels: `no-op` and `demo` at the bench's worker flags, `-defaults` with none; `forward-0ms` and "
  "`forward-50ms` forward every event (default flags) to a local sink answering at once or after 50 ms.")
w("")
w("| handler | events | seconds | events/s | worker CPU s |")
w("|---|---|---|---|---|")
for label, r in drain.items():
    res = r["result"]
    w(f"| {label} | {res['events']:,} | {res['seconds']:.2f} | {res['per_second']:,.0f} | {r['worker_cpu_seconds']:.1f} |")
w("")
if ordering_drains:
    w("## Ordered processing")
    w("")
    w("The same prefilled backlog drained with ordering off, with its events spread over 10,000 keys, "
      "and all on one key (`bench/ordering/run`, the bench's worker flags). Ingest with an ordering key: "
      "the demo provider, and the same provider ordering its events per object of 10,000 (`bench-ordered`).")
    w("")
    w("| drain | events | seconds | events/s |")
    w("|---|---|---|---|")
    for label, res in ordering_drains.items():
        w(f"| {label} | {res['events']:,} | {res['seconds']:.2f} | {res['per_second']:,.0f} |")
    w("")
    if ingest_variants:
        w("Ingest of the same bodies (128 connections): `demo`, `bench-ordered` (ordered per object), "
          "`bench-guarded` (id from a header, so replays are suppressed).")
        w("")
        w("| ingest | round | accepted/s | p99 ms |")
        w("|---|---|---|---|")
        for r in ingest_variants:
            res = r["result"]
            w(f"| {r['provider']} | {r['round']} | {res['per_second']:,.0f} | {res['p99_ms']:.2f} |")
        w("")
w("## End to end at 1,000 webhooks/s")
w("")
w(f"From the receiver's 2xx (as the client saw it) to the handler's commit (`processed_at`): "
  f"p50 {e2e.get('p50_ms', 0):.2f} ms, p99 {e2e.get('p99_ms', 0):.2f} ms, max {e2e.get('max_ms', 0):.2f} ms "
  f"over {e2e.get('processed', 0):,} events ({e2e.get('committed_before_ack_seen', 0):,} committed before the client "
  "had read its answer, counted as 0). Answers: p50 "
  f"{e2e.get('answer_p50_ms', 0):.2f} ms, p99 {e2e.get('answer_p99_ms', 0):.2f} ms.")
w("")
wal = {r["label"]: r["result"] for r in of("wal")}
if wal:
    w("## WAL per event")
    w("")
    w("Read back with `pg_waldump` between the run's first and last LSN (bench/wal-by-part.py): every record "
      "named by its table and sorted into the part of the event's life that wrote it. The ingest run is "
      "the group-commit run at 64 connections; the drains are at default flags (the `-defaults` runs above). "
      "Each run starts right after a checkpoint, so the first change of each page carries its full image.")
    w("")
    all_parts = sorted({p for r in wal.values() for p in r["parts"]})
    w("| run | bytes/event | of which full-page images | " + " | ".join(all_parts) + " |")
    w("|---|---|---|" + "---|" * len(all_parts))
    for label, r in wal.items():
        w(f"| {label} | {r['bytes_per_event']:,.0f} | {r['full_page_image_bytes_per_event']:,.0f} | "
          + " | ".join(f"{r['parts'].get(p, 0):,.0f}" for p in all_parts) + " |")
    ingest_wal = wal.get("ingest", {}).get("bytes_per_event", 0)
    demo_wal = wal.get("drain demo-defaults", {}).get("bytes_per_event", 0)
    w("")
    w(f"An event's whole life (ingest, then claim, completion and the demo handler's effect): "
      f"{ingest_wal + demo_wal:,.0f} bytes.")
    split = (of("ceiling_claim_complete_100") or [{}])[0].get("wal_bytes_per_event")
    one_table = (of("ceiling_claim_complete_100_one_table") or [{}])[0].get("wal_bytes_per_event")
    if split and one_table:
        w(f"The pgbench claim+completion loop above writes {split:,.0f} bytes per event on the split queue against "
          f"{one_table:,.0f} on the one-table inbox, whose every claim and completion rewrote the row with its body.")
    w("")
w("## Memory")
w("")
w("| binary | peak RSS MiB |")
w("|---|---|")
for k, v in peak.items():
    w(f"| {k} | {v:.1f} |")
w("")
w("![throughput and latency against concurrency](chart.svg)")
w("")
w("The changes these measurements led to, with before and after figures: [history.md](history.md).")
w("")
open(report_path, "w").write("\n".join(lines))

# A small two-panel SVG: accepted/s and p99 against connections, per mode, with the ceiling.
width, height, pad = 860, 340, 50
panel = (width - 3 * pad) / 2
colors = {"group-commit": "#1f77b4", "per-request": "#d62728"}
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
       '<rect width="100%" height="100%" fill="white"/>']


def draw(x0, title, key, ymax, unit, ceiling=None):
    y0, h = pad, height - 2 * pad
    svg.append(f'<text x="{x0}" y="{y0 - 15}" font-weight="bold">{title}</text>')
    svg.append(f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + panel}" y2="{y0 + h}" stroke="black"/>')
    svg.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="black"/>')
    conc = sorted({r["result"]["concurrency"] for r in ingest}) or [1]
    xs = {c: x0 + panel * (i + 0.5) / len(conc) for i, c in enumerate(conc)}
    for c, x in xs.items():
        svg.append(f'<text x="{x:.0f}" y="{y0 + h + 15}" text-anchor="middle">{c}</text>')
    svg.append(f'<text x="{x0 + panel / 2:.0f}" y="{y0 + h + 32}" text-anchor="middle">connections</text>')
    for frac in (0, 0.5, 1):
        y = y0 + h - frac * h
        svg.append(f'<text x="{x0 - 5}" y="{y + 4:.0f}" text-anchor="end">{ymax * frac:,.0f}</text>')
    if ceiling:
        y = y0 + h - min(ceiling / ymax, 1) * h
        svg.append(f'<line x1="{x0}" y1="{y:.0f}" x2="{x0 + panel}" y2="{y:.0f}" stroke="gray" stroke-dasharray="4"/>')
        svg.append(f'<text x="{x0 + panel - 2}" y="{y - 4:.0f}" text-anchor="end" fill="gray">pgbench one-row ceiling</text>')
    for i, (mode, runs) in enumerate(sorted(by_mode.items())):
        pts = [(xs[r["result"]["concurrency"]], y0 + h - min(r["result"][key] / ymax, 1) * h) for r in runs]
        svg.append('<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
            colors.get(mode, "black"), " ".join(f"{x:.0f},{y:.0f}" for x, y in pts)))
        svg.append(f'<text x="{x0 + 10}" y="{y0 + 15 + 15 * i}" fill="{colors.get(mode, "black")}">{mode} ({unit})</text>')


rate_max = max([r["result"]["per_second"] for r in ingest] + [best_one, 1]) * 1.1
p99_max = max([r["result"]["p99_ms"] for r in ingest] + [1]) * 1.1
draw(pad, "Accepted webhooks per second", "per_second", rate_max, "/s", best_one)
draw(2 * pad + panel, "p99 latency (ms)", "p99_ms", p99_max, "ms")
svg.append("</svg>")
open(chart_path, "w").write("\n".join(svg))
