#!/usr/bin/env python3
"""WAL written between two LSNs, by the part of the event's life that wrote it.

    wal-by-part.py PG_WAL_DIR START_LSN END_LSN DATABASE_URL {ingest|drain} EVENTS

Reads the records with pg_waldump (it must run beside the server's data folder), names each
record's first block by its table (indexes and day partitions count for their table), and sorts
the bytes into ingest (dedup key, journal, queue row), claim (queue updates and their index
entries, lease extensions included), completion (queue delete, finished row), effect (the demo
handler's tables), commits, pruning and vacuum, and other. Prints one JSON object, bytes per
event for each part."""
import collections
import glob
import json
import re
import shutil
import subprocess
import sys

wal_dir, start, end, database_url, phase, events = sys.argv[1:7]
events = int(events)

def find_waldump():
    """pg_waldump is not on PATH in Debian's packaging: look beside the server binaries."""
    found = shutil.which("pg_waldump")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_waldump"), key=lambda p: int(p.split("/")[4]))
    if not candidates:
        sys.exit("pg_waldump not found")
    return candidates[-1]


waldump = find_waldump()

names = {}
query = """SELECT pg_relation_filenode(c.oid), coalesce(t.relname, c.relname)
           FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid
           LEFT JOIN pg_class t ON t.oid = i.indrelid
           WHERE pg_relation_filenode(c.oid) IS NOT NULL"""
listing = subprocess.run(["psql", "-X", "-At", "-F", "\t", database_url, "-c", query],
                         capture_output=True, text=True, check=True).stdout
for line in listing.splitlines():
    filenode, table = line.split("\t")
    names[filenode] = re.sub(r"_\d{8}$", "", table)  # a day of the journal is the journal

record = re.compile(r"rmgr: (\S+)\s+len \(rec/tot\):\s+(\d+)/\s*(\d+),.*?desc: (\S+)(.*)")
block = re.compile(r"blkref #0: rel \d+/\d+/(\d+)")
ingest_tables = {"inbox_dedup", "inbox_events", "inbox_keys"}
effect_tables = {"demo_ledger", "processed_events", "demo_payments"}


def part(rmgr, op, table, is_index):
    if rmgr == "Transaction":
        return "commits"
    if rmgr == "Heap2" and op in ("PRUNE", "VACUUM", "VISIBLE", "FREEZE_PAGE") or rmgr == "Btree" and op in ("VACUUM", "DELETE"):
        return "pruning and vacuum"
    if table in ingest_tables:
        return "ingest"
    if table in effect_tables:
        return "effect"
    if table == "inbox_finished":
        return "completion"
    if table == "inbox_queue":
        if is_index:
            return "ingest" if phase == "ingest" else "claim"
        if op in ("INSERT", "MULTI_INSERT", "INSERT+INIT", "MULTI_INSERT+INIT"):
            return "ingest"
        if op == "DELETE":
            return "completion"
        return "claim"
    return "other"


index_filenodes = set(subprocess.run(
    ["psql", "-X", "-At", database_url, "-c",
     "SELECT pg_relation_filenode(indexrelid) FROM pg_index WHERE pg_relation_filenode(indexrelid) IS NOT NULL"],
    capture_output=True, text=True, check=True).stdout.split())

parts = collections.Counter()
tables = collections.Counter()
full_page_images = 0
dump = subprocess.Popen([waldump, "-p", wal_dir, "-s", start, "-e", end], stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, text=True)
for line in dump.stdout:
    m = record.match(line)
    if not m:
        continue
    rmgr, rec, tot, op, rest = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4), m.group(5)
    b = block.search(rest)
    filenode = b.group(1) if b else None
    table = names.get(filenode, "other") if filenode else "none"
    full_page_images += tot - rec
    parts[part(rmgr, op, table, filenode in index_filenodes)] += tot
    tables[table] += tot
dump.wait()
total = sum(parts.values())
per = lambda n: round(n / events, 1) if events else None
print(json.dumps({
    "events": events,
    "bytes_per_event": per(total),
    "full_page_image_bytes_per_event": per(full_page_images),
    "parts": {k: per(v) for k, v in parts.most_common()},
    "tables": {k: per(v) for k, v in tables.most_common(8)},
}))
