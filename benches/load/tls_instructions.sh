#!/usr/bin/env bash
# User-space instructions per request over TLS, counted by valgrind's callgrind:
# the TLS sibling of instructions.sh (same route, key and nginx upstream, the
# gateway with `workers = 1` and an ECDSA P-256 certificate). h2load sends WARM
# requests, the counters are zeroed, then N requests are counted.
#
#   benches/load/tls_instructions.sh             # MODE=h2: HTTP/2, 10 connections x 32 streams
#   MODE=h1 benches/load/tls_instructions.sh     # HTTP/1.1 keep-alive, 50 connections
#   N=5000 benches/load/tls_instructions.sh      # quicker (default N=20000 WARM=2000)
#
# Prints the total and the per-request figure, and leaves the callgrind file
# (for `callgrind_annotate`) in $OUT (default /tmp/mpg-tls-instructions.out).
# GW=path/to/mpg-gateway counts that binary; else the release build.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../lib.sh"
N=${N:-20000} WARM=${WARM:-2000} OUT=${OUT:-/tmp/mpg-tls-instructions.out} MODE=${MODE:-h2}
for tool in valgrind callgrind_control nginx h2load openssl; do
  command -v "$tool" >/dev/null || { echo "tls_instructions.sh: needs $tool" >&2; exit 1; }
done
case "$MODE" in
  h2) LOAD=(-c 10 -m 32) ;;
  h1) LOAD=(--h1 -c 50 -m 1) ;;
  *) echo "tls_instructions.sh: MODE is h2 or h1, not $MODE" >&2; exit 2 ;;
esac
if [ -z "${GW:-}" ]; then
  build_gateway
  GW="$ROOT/target/release/mpg-gateway"
fi

on_exit() { [ ! -f "$WORK/up/nginx.pid" ] || kill "$(cat "$WORK/up/nginx.pid")" 2>/dev/null; }
work_dir mpg-tls-instr
UP_PORT=$(free_port); GW_PORT=$(free_port)

upstream_conf "$WORK/up" "$UP_PORT" '{"clusters":[]}'
nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" -g 'daemon on;'
wait_port "$UP_PORT"

self_signed "$WORK"

CFG="$WORK/gw.toml"
STORE="$(printf 'kind = "sqlite"\npath = "%s"' "$WORK/gateway.db")"
bench_config "$CFG" "$GW_PORT" "$UP_PORT" "$STORE" 'backend = "local"' \
  "$(printf '[server.tls]\ncert = "%s"\nkey = "%s"' "$WORK/cert.pem" "$WORK/key.pem")"
seed_account "$CFG"
python3 "$HERE/lib/seed.py" "$WORK/gateway.db" acme alice 10 "$WORK/keys.txt" "$WORK/invalid.txt" >/dev/null
KEY="$(head -n 1 "$WORK/keys.txt")"
URL="https://127.0.0.1:$GW_PORT/api/v1/clusters?organization_id=acme"

rm -f "$OUT" "$OUT".*
valgrind --tool=callgrind --callgrind-out-file="$OUT" "$GW" run --config "$CFG" >"$WORK/gw.log" 2>&1 &
VG=$!
PIDS+=("$VG")
wait_port "$GW_PORT" 60 # valgrind starts slowly
h2load -t1 "${LOAD[@]}" -n "$WARM" -H "Authorization: Bearer $KEY" "$URL" >"$WORK/warm.txt" 2>&1
callgrind_control -z "$VG" >/dev/null 2>&1
h2load -t1 "${LOAD[@]}" -n "$N" -H "Authorization: Bearer $KEY" "$URL" >"$WORK/h2load.txt" 2>&1
grep -q "status codes: $N 2xx" "$WORK/h2load.txt" || { echo "tls_instructions.sh: requests failed" >&2; cat "$WORK/h2load.txt" >&2; exit 1; }
callgrind_control -d "$VG" >/dev/null 2>&1
sleep 1
# The dump after zeroing is "$OUT.1" (callgrind numbers later parts).
total=$(awk '/^(summary|totals):/ {print $2; exit}' "$OUT.1")
echo "$MODE over TLS, $N requests: $total instructions in the gateway's user space, $((total / N)) per request"
echo "callgrind file: $OUT.1 (callgrind_annotate --threshold=100 $OUT.1)"
