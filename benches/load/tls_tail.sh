#!/usr/bin/env bash
# The tail of TLS keep-alive beside plain HTTP's, back to back: two gateways
# (`workers = 1`, core 0), one plain and one TLS, the load generator and the
# nginx upstream on core 1, as in run.sh's saturation rounds: 50 keep-alive
# connections each sending its next request as soon as its answer is in.
# Rounds alternate plain and TLS so that a slow spell of a shared machine
# lands on both alike. The load is h2load --h1 with a per-request log, so the
# tail is given twice: over all requests, and over those begun after the
# first 200 ms (once every connection is open: with TLS, the 50 handshakes
# at the start, the gateway's and the client's, delay the first requests).
#
#   benches/load/tls_tail.sh                        # 5 rounds x 5 s each
#   ROUNDS=3 DURATION=3 benches/load/tls_tail.sh
#   GW=path/to/mpg-gateway benches/load/tls_tail.sh  # another build
#
# Prints one line per run (tail.py reads h2load's log): requests/s, p99.9 and
# max over all requests, p50, p99 and p99.9 after the first 200 ms; then the
# medians of each. run.sh measures the same way in its keep-alive tail scenario.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../lib.sh"
ROUNDS=${ROUNDS:-5} DURATION=${DURATION:-5} CONNS=${CONNS:-50}
for tool in h2load nginx openssl taskset; do
  command -v "$tool" >/dev/null || { echo "tls_tail.sh: needs $tool" >&2; exit 1; }
done
if [ -z "${GW:-}" ]; then
  build_gateway
  GW="$ROOT/target/release/mpg-gateway"
fi

on_exit() { [ ! -f "$WORK/up/nginx.pid" ] || kill "$(cat "$WORK/up/nginx.pid")" 2>/dev/null; }
work_dir mpg-tls-tail
UP_PORT=$(free_port); GW_PORT=$(free_port); GWS_PORT=$(free_port)

upstream_conf "$WORK/up" "$UP_PORT" '{"clusters":[]}'
taskset -c 1 nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" -g 'daemon on;'
wait_port "$UP_PORT"
self_signed "$WORK"

STORE="$(printf 'kind = "sqlite"\npath = "%s"' "$WORK/gateway.db")"
bench_config "$WORK/plain.toml" "$GW_PORT" "$UP_PORT" "$STORE" 'backend = "local"'
bench_config "$WORK/tls.toml" "$GWS_PORT" "$UP_PORT" "$STORE" 'backend = "local"' \
  "$(printf '[server.tls]\ncert = "%s"\nkey = "%s"' "$WORK/cert.pem" "$WORK/key.pem")"
seed_account "$WORK/plain.toml"
python3 "$HERE/lib/seed.py" "$WORK/gateway.db" acme alice 10 "$WORK/keys.txt" "$WORK/invalid.txt" >/dev/null
KEY="$(head -n 1 "$WORK/keys.txt")"
Q="/api/v1/clusters?organization_id=acme"
run_gateway "$WORK/plain.toml" "$GW_PORT" "$WORK/gw.log" taskset -c 0
PLAIN_PID=$GW_PID
run_gateway "$WORK/tls.toml" "$GWS_PORT" "$WORK/gw.log" taskset -c 0
TLS_PID=$GW_PID
# Warm both (key cache, connections to the upstream).
for url in "http://127.0.0.1:$GW_PORT$Q" "https://127.0.0.1:$GWS_PORT$Q"; do
  taskset -c 1 h2load --h1 -t1 -c "$CONNS" -D 1 -H "Authorization: Bearer $KEY" "$url" >/dev/null
done
: >"$WORK/results.txt"
for r in $(seq "$ROUNDS"); do
  for kind in plain tls; do
    case $kind in
      plain) url="http://127.0.0.1:$GW_PORT$Q" ;;
      tls) url="https://127.0.0.1:$GWS_PORT$Q" ;;
    esac
    rm -f "$WORK/req.log" # h2load appends to it
    taskset -c 1 h2load --h1 -t1 -c "$CONNS" -D "$DURATION" -H "Authorization: Bearer $KEY" \
      --log-file="$WORK/req.log" "$url" >"$WORK/h2load.out" 2>&1
    fields=$(python3 "$HERE/lib/tail.py" "$WORK/req.log")
    echo "{\"kind\":\"$kind\",$fields}" >>"$WORK/results.txt"
    python3 - "$WORK/results.txt" "$r" <<'EOT'
import json, sys
d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
if d["errors"] or d["non_2xx"]:
    sys.exit(f"tls_tail.sh: {d['errors'] + d['non_2xx']} of {d['requests']} requests failed")
print(f"{d['kind']:5} round {sys.argv[2]}: {d['requests'] / d['duration_us'] * 1e6:6.0f} req/s  all: p99.9 {d['p999_all_us']:6d}  max {d['max_us']:6d} µs"
      f" | after 200 ms: p50 {d['p50_us']:6d}  p99 {d['p99_us']:6d}  p99.9 {d['p999_us']:6d} µs")
EOT
  done
done
python3 - "$WORK/results.txt" <<'EOT'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
for kind in ("plain", "tls"):
    rs = [r for r in runs if r["kind"] == kind]
    m = lambda f: statistics.median(f(r) for r in rs)
    print(f"{kind:5} median: {m(lambda r: r['requests'] / r['duration_us'] * 1e6):.0f} req/s  all: p99.9 {m(lambda r: r['p999_all_us']):.0f}"
          f"  max {m(lambda r: r['max_us']):.0f} µs | after 200 ms: p50 {m(lambda r: r['p50_us']):.0f}  p99 {m(lambda r: r['p99_us']):.0f}"
          f"  p99.9 {m(lambda r: r['p999_us']):.0f} µs")
EOT
