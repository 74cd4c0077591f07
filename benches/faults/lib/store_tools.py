#!/usr/bin/env python3
"""Helpers of benches/faults/store.sh, all on 127.0.0.1 and all bounded in time.

  store_tools.py proxy LISTEN_PORT TARGET_PORT
      A TCP proxy to 127.0.0.1:TARGET_PORT that the suite cuts: SIGUSR1 stops
      listening and closes every relayed connection, so connects are refused
      (RST, in well under a millisecond) as by a server that is down; SIGUSR2
      listens again. SIGTERM ends it.
  store_tools.py once PORT KEY
      One GET of the clusters route with KEY: prints "STATUS MS RETRY_AFTER".
  store_tools.py until PORT KEY STATUS LIMIT_S
      Asks every 5 ms until KEY gets STATUS: prints the milliseconds it took
      (or "none" after LIMIT_S).
  store_tools.py flood PORT SECONDS CONNS VALID_KEY GATEWAY_PID ADMIN_PORT AFTER_S OUT_JSON
      CONNS keep-alive connections send requests with random, well-formed API
      keys (the checksum is right, the store knows none of them) for SECONDS;
      one request in 100 carries VALID_KEY. Samples the gateway's RSS and
      negative cache entries every 5 s, and again AFTER_S after the flood.
  store_tools.py phases CUT_US BACK_US END_US OUT_JSON LOG...
      Reads h2load --log-file LOGs; prints and writes throughput, p50/p99/max
      and the slowest second before, during and after the outage.
"""
import asyncio
import json
import os
import signal
import sys
import time
import urllib.request
import zlib

ALPHABET = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Random bytes to base62 in one translate (the slight bias is irrelevant here).
TO_BASE62 = bytes(ALPHABET[i % 62] for i in range(256))
PATH = "/api/v1/clusters?organization_id=acme"


def random_key() -> bytes:
    """`mpg_` + 32 base62 + 6 base62 of the CRC32 over the 32 (src/auth/token.rs)."""
    body = os.urandom(32).translate(TO_BASE62)
    value = zlib.crc32(body)
    check = bytearray(6)
    for i in range(5, -1, -1):
        check[i] = ALPHABET[value % 62]
        value //= 62
    return b"mpg_" + body + bytes(check)


def request(port: int, key: bytes) -> bytes:
    return (
        b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1:" + str(port).encode()
        + b"\r\nAuthorization: Bearer " + key + b"\r\n\r\n"
    )


async def exchange(reader, writer, raw: bytes):
    """Sends one request, reads its response: (status, headers dict)."""
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers


# ---------------------------------------------------------------- proxy
async def proxy(listen_port: int, target_port: int) -> None:
    loop = asyncio.get_running_loop()
    relays = set()
    state = {"server": None}

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def handle(reader, writer):
        relays.add(asyncio.current_task())
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            relays.discard(asyncio.current_task())
            return
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            up_writer.close()
            relays.discard(asyncio.current_task())

    async def listen():
        if state["server"] is None:
            state["server"] = await asyncio.start_server(
                handle, "127.0.0.1", listen_port, reuse_address=True
            )

    def cut():
        if state["server"] is not None:
            state["server"].close()
            state["server"] = None
        for task in list(relays):
            task.cancel()

    done = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, cut)
    loop.add_signal_handler(signal.SIGUSR2, lambda: loop.create_task(listen()))
    loop.add_signal_handler(signal.SIGTERM, done.set)
    loop.add_signal_handler(signal.SIGINT, done.set)
    await listen()
    print("proxy listening", flush=True)
    await done.wait()
    cut()


# ---------------------------------------------------------------- once / until
async def once(port: int, key: str) -> None:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    status, headers = await exchange(reader, writer, request(port, key.encode()))
    took = (time.perf_counter() - started) * 1000
    writer.close()
    print(f"{status} {took:.1f} {headers.get('retry-after', '-')}")


async def until(port: int, key: str, want: int, limit: float) -> None:
    started = time.perf_counter()
    raw = request(port, key.encode())
    while time.perf_counter() - started < limit:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            status, _ = await exchange(reader, writer, raw)
            writer.close()
            if status == want:
                print(f"{(time.perf_counter() - started) * 1000:.0f}")
                return
        except OSError:
            pass
        await asyncio.sleep(0.005)
    print("none")


# ---------------------------------------------------------------- flood
def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def metric(admin_port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as res:
        text = res.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def flood(port, seconds, conns, valid_key, pid, admin_port, after, out) -> None:
    deadline = time.perf_counter() + seconds
    counts = {}
    valid_ms = []
    samples = []

    def sample(label):
        samples.append({
            "at_s": round(time.perf_counter() - (deadline - seconds), 1),
            "phase": label,
            "rss_mib": round(rss_mib(pid), 1),
            "negative_entries": metric(admin_port, "mpg_key_cache_negative_entries"),
            "entries": metric(admin_port, "mpg_key_cache_entries"),
        })
        print(f"  {samples[-1]}", flush=True)

    async def worker(n: int):
        valid = request(port, valid_key.encode())
        reader = writer = None
        i = n
        while time.perf_counter() < deadline:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            i += 1
            is_valid = i % 100 == 0
            started = time.perf_counter()
            try:
                status, headers = await exchange(reader, writer, valid if is_valid else request(port, random_key()))
            except (OSError, asyncio.IncompleteReadError):
                writer.close()
                writer = None
                counts["error"] = counts.get("error", 0) + 1
                continue
            if is_valid:
                valid_ms.append((time.perf_counter() - started) * 1000)
                status = f"valid {status}"
            counts[str(status)] = counts.get(str(status), 0) + 1
            if headers.get("connection", "").lower() == "close":
                writer.close()
                writer = None
        if writer is not None:
            writer.close()

    async def sampler():
        while time.perf_counter() < deadline:
            await asyncio.sleep(min(5.0, max(0.0, deadline - time.perf_counter())))
            if time.perf_counter() < deadline:
                sample("flood")

    sample("before")
    await asyncio.gather(sampler(), *(worker(n) for n in range(conns)))
    sample("end of flood")
    await asyncio.sleep(after)
    sample(f"{after:g} s later")
    total = sum(counts.values())
    valid_ms.sort()
    result = {
        "seconds": seconds,
        "requests": total,
        "requests_per_s": round(total / seconds),
        "statuses": counts,
        "valid_key_p99_ms": round(valid_ms[int(len(valid_ms) * 0.99)], 2) if valid_ms else None,
        "samples": samples,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}))


# ---------------------------------------------------------------- phases
def phases(cut_us: int, back_us: int, end_us: int, out: str, logs) -> None:
    rows = []
    for path in logs:
        with open(path) as f:
            for line in f:
                parts = line.split("\t")
                if len(parts) >= 3:
                    rows.append((int(parts[0]), int(parts[1]), int(parts[2])))
    start_us = min(r[0] for r in rows)
    # The first second warms connections; the last second is cut short.
    spans = {
        "before": (start_us + 1_000_000, cut_us),
        "during": (cut_us, back_us),
        "after": (back_us, end_us - 1_000_000),
    }
    report = {}
    for name, (lo, hi) in spans.items():
        picked = [r for r in rows if lo <= r[0] < hi]
        lat = sorted(r[2] for r in picked)
        per_second = {}
        for r in picked:
            per_second[(r[0] - lo) // 1_000_000] = per_second.get((r[0] - lo) // 1_000_000, 0) + 1
        whole = [per_second.get(s, 0) for s in range(max(1, (hi - lo) // 1_000_000))]
        q = lambda p: round(lat[min(len(lat) - 1, int(len(lat) * p))] / 1000, 2) if lat else None
        report[name] = {
            "seconds": round((hi - lo) / 1e6, 1),
            "requests": len(picked),
            "requests_per_s": round(len(picked) / ((hi - lo) / 1e6)) if hi > lo else 0,
            "slowest_second_requests": min(whole) if whole else 0,
            "non_200": sum(1 for r in picked if r[1] != 200),
            "per_second": whole,
            "p50_ms": q(0.50),
            "p99_ms": q(0.99),
            "max_ms": round(lat[-1] / 1000, 2) if lat else None,
        }
        print(f"  {name:7} {json.dumps({k: v for k, v in report[name].items() if k != 'per_second'})}")
        print(f"          per second: {whole}")
    with open(out, "w") as f:
        json.dump(report, f, indent=1)


def main() -> None:
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "proxy":
        asyncio.run(proxy(int(args[0]), int(args[1])))
    elif cmd == "once":
        asyncio.run(once(int(args[0]), args[1]))
    elif cmd == "until":
        asyncio.run(until(int(args[0]), args[1], int(args[2]), float(args[3])))
    elif cmd == "flood":
        asyncio.run(flood(int(args[0]), float(args[1]), int(args[2]), args[3], int(args[4]),
                          int(args[5]), float(args[6]), args[7]))
    elif cmd == "phases":
        phases(int(args[0]), int(args[1]), int(args[2]), args[3], args[4:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
