#!/usr/bin/env python3
"""Bare round trips to a Redis at a steady rate while a load runs: one PING at a time,
RATE a second for SECONDS, each timed from its send to its answer. Prints one JSON line:
how many, and their p50, p99 and max in µs.

    rtt_probe.py PORT RATE SECONDS     # Redis on 127.0.0.1:PORT

A request whose limit is decided in Redis waits for at least one such round trip. The
probe is a Python process on the gateway's busy core, though: where round trips are cheap
its own wake-ups dominate its p99, so read that p99 as a floor under the gateway's wait
only where it is below it.
"""
import json
import socket
import sys
import time

from tail import pct

port, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
sock = socket.create_connection(("127.0.0.1", port))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
sock.settimeout(10)  # a Redis that stops answering ends the probe, not the run
ping, pong = b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n"
times = []
step = 1e9 / rate
start = time.perf_counter_ns()
end = start + int(seconds * 1e9)
due = start
while due < end:
    now = time.perf_counter_ns()
    if now < due:
        time.sleep((due - now) / 1e9)
    t0 = time.perf_counter_ns()
    sock.sendall(ping)
    got = b""
    while len(got) < len(pong):
        try:
            chunk = sock.recv(64)
        except socket.timeout:
            sys.exit("rtt_probe.py: no answer from Redis within 10 s")
        if not chunk:
            sys.exit("rtt_probe.py: Redis closed the connection")
        got += chunk
    times.append((time.perf_counter_ns() - t0) / 1000)
    due += step
times.sort()
print(json.dumps({"n": len(times), "p50_us": round(pct(times, 0.5)), "p99_us": round(pct(times, 0.99)),
                  "max_us": round(times[-1])}))
