#!/usr/bin/env python3
"""Reads `redis-benchmark --csv` of one test on stdin and prints its latencies as one JSON
line: round trips a second, and their p50, p99 and max in ms (null if none was read).

    taskset -c 0 redis-benchmark -u URL -c 1 -n 10000 -t ping_mbulk --csv | redis_rtt.py
"""
import csv
import json
import sys

rows = [r for r in csv.DictReader(sys.stdin) if r.get("test")]
if not rows:
    print("null")
else:
    r = rows[0]
    print(json.dumps({
        "per_s": float(r["rps"]),
        "p50_ms": float(r["p50_latency_ms"]),
        "p99_ms": float(r["p99_latency_ms"]),
        "max_ms": float(r["max_latency_ms"]),
    }))
