#!/usr/bin/env python3
"""One raw line (scenario `pg_store`) for a cold-store run of the load suite, from the
gateway's metrics scraped an idle second before the cold run (MI), right before it
(M0), after it (M1) and once every key is cached (M2: the cold run sends each key once,
so right after it), the times of MI, M0 and M1 (ns), its RSS (KiB) at M0 and M2, and the cold run's own raw line: store
queries per key seen cold (those the gateway makes idle, at the idle second's rate,
taken off), and the RSS each cached key takes.

usage: store_figures.py MI M0 M1 M2 TI_NS T0_NS T1_NS RSS0_KIB RSS2_KIB RUN COLD_RAW_LINE
"""
import json
import sys


def read(path):
    """Sums of the samples by metric name (labels dropped) and by the name with its labels."""
    by_name, by_series = {}, {}
    for line in open(path):
        if not line.strip() or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        by_name[name] = by_name.get(name, 0.0) + float(value)
        by_series[series] = float(value)
    return by_name, by_series


def main():
    (mi, _), (m0, s0), (m1, s1), (m2, _) = (read(p) for p in sys.argv[1:5])
    ti, t0, t1 = (int(v) for v in sys.argv[5:8])
    rss0, rss2, run = int(sys.argv[8]), int(sys.argv[9]), int(sys.argv[10])
    cold = json.loads(sys.argv[11])
    count = "mpg_store_query_duration_seconds_count"
    idle = (m0.get(count, 0) - mi.get(count, 0)) / ((t0 - ti) / 1e9)
    background = idle * (t1 - t0) / 1e9
    queries = m1.get(count, 0) - m0.get(count, 0) - background
    miss = 'mpg_key_cache_lookups_total{result="miss"}'
    misses = s1.get(miss, 0) - s0.get(miss, 0)
    requests = cold["requests"]
    entries = m2.get("mpg_key_cache_entries", 0) - m0.get("mpg_key_cache_entries", 0)
    print(json.dumps({
        "scenario": "pg_store", "target": "gateway_pg", "run": run,
        "cold_requests": requests,
        # More requests than keys: the run came round to keys it had seen (warm ones).
        "cold_wrapped": requests > 100000,
        "store_queries": round(queries), "idle_queries_taken_off": round(background, 1),
        "cache_misses": round(misses),
        # Each miss of the cold run is a key first seen (those still in flight at its end
        # included).
        "queries_per_key": round(queries / misses, 3) if misses else None,
        "cache_entries_added": round(entries),
        "rss_added_kib": rss2 - rss0,
        "rss_bytes_per_cached_key": round((rss2 - rss0) * 1024 / entries) if entries > 0 else None,
    }, separators=(",", ":")))


if __name__ == "__main__":
    main()
