"""The latency tail of one keep-alive run of h2load --h1, from its per-request log
(--log-file: start time in µs, status, latency in µs, one line per request).

With TLS, the handshakes of every connection at the start of a run delay the first
requests on a server with one core; the tail of steady keep-alive traffic is read from
the requests begun once every connection is open (WARM_US after the first). Prints the
fields run.sh records: requests, duration_us, errors, non_2xx, p50/p99/p999_us over the
requests begun after WARM_US, and p999_all_us and max_us over all of them.

usage: python3 tail.py LOG [WARM_US]     (WARM_US: 200000)
"""
import sys


def pct(sorted_lat, p):
    return sorted_lat[min(len(sorted_lat) - 1, int(p * len(sorted_lat)))]


def main():
    path = sys.argv[1]
    warm_us = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    rows = []
    for line in open(path):
        f = line.split("\t")
        rows.append((int(f[0]), f[1], int(f[2])))
    if not rows:
        sys.exit(f"tail.py: {path} holds no request")
    t0 = min(r[0] for r in rows)
    end = max(r[0] + r[2] for r in rows)
    errors = sum(1 for r in rows if not r[1].isdigit() or r[1] == "-1")
    non_2xx = sum(1 for r in rows if r[1].isdigit() and not r[1].startswith("2"))
    every = sorted(r[2] for r in rows)
    late = sorted(r[2] for r in rows if r[0] - t0 >= warm_us) or every
    print(
        f'"requests":{len(rows)},"duration_us":{end - t0},"errors":{errors},"non_2xx":{non_2xx},'
        f'"p50_us":{pct(late, 0.5)},"p99_us":{pct(late, 0.99)},"p999_us":{pct(late, 0.999)},'
        f'"p999_all_us":{pct(every, 0.999)},"max_us":{every[-1]},"warm_us":{warm_us}'
    )


if __name__ == "__main__":
    main()
