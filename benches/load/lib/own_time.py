#!/usr/bin/env python3
"""The gateway's own time per request over one run, from two scrapes of its
/metrics (before and after): the `mpg_request_duration_seconds` histogram of
the bench route, from the request head read to the response head ready (the
upstream's answer included). Prints one raw line for run.sh: the requests
counted, the share answered within 1 ms, and the p99 read off the buckets
(linearly within the bucket it falls in).

With FAMILY and LABELS, another histogram instead: its family name and the label
text that comes before `le` (`mpg_rate_limit_backend_duration_seconds
'backend="redis"'`: the time each request waited for its Redis decision).

usage: own_time.py METRICS_BEFORE METRICS_AFTER RUN [FAMILY LABELS]
"""
import json
import re
import sys

ROUTE = "/api/v1/clusters"


def pattern(family, labels):
    return re.compile(
        "^" + re.escape(family) + r"_bucket\{" + re.escape(labels) + r',le="([^"]+)"\} (\S+)$'
    )


def buckets(path, pattern):
    with open(path) as f:
        return {m.group(1): float(m.group(2)) for m in map(pattern.match, f) if m}


def main():
    family, labels = "mpg_request_duration_seconds", f'route="{ROUTE}"'
    if len(sys.argv) > 4:
        family, labels = sys.argv[4], sys.argv[5]
    wanted = pattern(family, labels)
    before, after, run = buckets(sys.argv[1], wanted), buckets(sys.argv[2], wanted), int(sys.argv[3])
    if not after:
        sys.exit(f"own_time.py: no {family}{{{labels}}} histogram in {sys.argv[2]}")
    cumulative = sorted((float(le), after[le] - before.get(le, 0.0)) for le in after)
    n = cumulative[-1][1]
    if n <= 0:
        sys.exit("own_time.py: no request counted between the two scrapes")
    within_1ms = next(c for le, c in cumulative if le == 0.001) / n
    want, lower, below, p99 = 0.99 * n, 0.0, 0.0, None
    for le, c in cumulative:
        if c >= want:
            # The +Inf bucket has no upper bound: its lower one is all we know.
            p99 = lower if le == float("inf") else lower + (le - lower) * (want - below) / (c - below)
            break
        lower, below = le, c
    print(json.dumps({
        "scenario": "own_time", "target": "gateway", "run": run, "tool": "histogram",
        "requests": int(n), "within_1ms": round(within_1ms, 5), "own_p99_us": round(p99 * 1e6),
    }))


if __name__ == "__main__":
    main()
