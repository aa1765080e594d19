#!/usr/bin/env python3
"""Receiver memory under floods: resident memory (VmRSS) of a running receiver while
(1) many connections trickle 1 MiB bodies and small signed webhooks are sent meanwhile, and
(2) 400 signed 1 MiB webhooks arrive at once, each retried after a 503 until acknowledged.

Usage: bench/memory.py RECEIVER_PID HOST:PORT SECRET [TRICKLERS] [BURST]
Prints one JSON line per phase: peak and final RSS, small-webhook latencies, counts.

The receiver it measures serves the `demo` provider of config/providers.example.toml, e.g.:
  DEMO_WEBHOOK_SECRET=memory-secret INBOX_CONFIG=config/providers.example.toml \
    target/debug/receiver serve --listen 127.0.0.1:18480 --metrics-listen 127.0.0.1:18491 \
    --http-workers 2 --db-pool-size 16 &
  bench/memory.py $! 127.0.0.1:18480 memory-secret 1000 400
("before" adds --max-body-bytes-in-flight 1099511627776 --max-connections 1000000).
"""
import asyncio, hashlib, hmac, json, sys, time, uuid

MIB = 1024 * 1024


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Peak:
    def __init__(self, pid):
        self.pid, self.peak, self.running = pid, 0.0, True

    async def watch(self):
        while self.running:
            self.peak = max(self.peak, rss_mib(self.pid))
            await asyncio.sleep(0.05)


def signed_request(host, secret, body):
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    head = (f"POST /webhooks/demo HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"X-Signature: sha256={signature}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode() + body


async def exchange(host, port, request):
    try:
        return await asyncio.wait_for(exchange_once(host, port, request), 30)
    except asyncio.TimeoutError:
        return 0


async def exchange_once(host, port, request):
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        status_line = await reader.readline()
        await reader.read()
        return int(status_line.split()[1]) if status_line else 0
    except (ConnectionError, IndexError, ValueError):
        return 0
    finally:
        writer.close()


async def trickler(host, port, stop):
    """Declares a 1 MiB body, sends all but its last byte, then holds the connection."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
        head = (f"POST /webhooks/demo HTTP/1.1\r\nHost: {host}\r\nX-Signature: sha256=00\r\n"
                f"Content-Length: {MIB}\r\n\r\n").encode()
        writer.write(head)
        for _ in range(16):
            writer.write(b" " * (MIB // 16 - (1 if _ == 15 else 0)))
            await writer.drain()
            await asyncio.sleep(0.05)
        await stop.wait()
        writer.close()
        return "held"
    except (ConnectionError, OSError):
        return "refused"


async def small_webhooks(host, port, secret, count):
    latencies, statuses = [], []
    for _ in range(count):
        body = json.dumps({"id": str(uuid.uuid4()), "type": "small"}).encode()
        started = time.monotonic()
        statuses.append(await exchange(host, port, signed_request(host, secret, body)))
        latencies.append((time.monotonic() - started) * 1000)
        await asyncio.sleep(0.01)
    latencies.sort()
    return {
        "sent": count,
        "ok": statuses.count(200),
        "p50_ms": round(latencies[len(latencies) // 2], 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 1),
    }


async def trickle_phase(pid, host, port, secret, tricklers):
    peak = Peak(pid)
    watcher = asyncio.create_task(peak.watch())
    stop = asyncio.Event()
    tasks = [asyncio.create_task(trickler(host, port, stop)) for _ in range(tricklers)]
    await asyncio.sleep(2)
    small = await small_webhooks(host, port, secret, 200)
    stop.set()
    outcomes = await asyncio.gather(*tasks)
    await asyncio.sleep(1)
    peak.running = False
    await watcher
    return {"connections": tricklers, "held": outcomes.count("held"), "peak_rss_mib": round(peak.peak, 1),
            "rss_after_mib": round(rss_mib(pid), 1), "small_webhooks": small}


async def deliver_until_acked(host, port, secret, index, attempts):
    pad = "x" * (MIB - 100)
    body = json.dumps({"id": f"burst-{index}-{uuid.uuid4()}", "type": "big", "pad": pad}).encode()
    for attempt in range(1, 100):
        status = await exchange(host, port, signed_request(host, secret, body))
        if status == 200:
            attempts.append(attempt)
            return True
        await asyncio.sleep(0.2)
    return False


async def burst_phase(pid, host, port, secret, burst):
    peak = Peak(pid)
    watcher = asyncio.create_task(peak.watch())
    attempts = []
    acked = await asyncio.gather(*(deliver_until_acked(host, port, secret, n, attempts) for n in range(burst)))
    peak.running = False
    await watcher
    await asyncio.sleep(5)
    return {"webhooks": burst, "acked": sum(acked), "retried": sum(1 for a in attempts if a > 1),
            "peak_rss_mib": round(peak.peak, 1), "rss_5s_after_mib": round(rss_mib(pid), 1)}


async def main():
    pid, address, secret = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    tricklers = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
    burst = int(sys.argv[5]) if len(sys.argv) > 5 else 400
    host, port = address.rsplit(":", 1)
    report = {"rss_idle_mib": round(rss_mib(pid), 1)}
    report["trickle"] = await trickle_phase(pid, host, int(port), secret, tricklers)
    print(json.dumps(report), flush=True)
    report = {"burst": await burst_phase(pid, host, int(port), secret, burst)}
    print(json.dumps(report), flush=True)


asyncio.run(main())
