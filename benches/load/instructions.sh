#!/usr/bin/env bash
# User-space instructions per proxied request, counted by valgrind's callgrind:
# repeatable where wall-clock figures are not (a noisy machine moves req/s by
# ±15% between runs; the count does not move). The gateway runs under callgrind
# in front of an nginx upstream; oha sends WARM requests, the counters are
# zeroed, then N requests (50 connections) are counted.
#
#   benches/load/instructions.sh            # N=20000 WARM=2000
#   N=5000 benches/load/instructions.sh     # quicker
#   N=3000 RATE=300 benches/load/instructions.sh
#       # counted requests paced at RATE per second (oha -q): each one finds the
#       # gateway idle, so the count includes waking it and parking it again
#   H2=1 N=5000 benches/load/instructions.sh
#       # the same over h2c (oha --http2, prior knowledge): the HTTP/2 server's path
#   BACKEND=redis N=5000 benches/load/instructions.sh
#       # the same with `[rate_limit] backend = "redis"` against a Redis of its
#       # own (redis-server on a free port): the gateway's side of the shared limiter
#   CREDITS=1 N=5000 benches/load/instructions.sh
#   CREDITS=1 BACKEND=redis N=5000 benches/load/instructions.sh
#       # the same with a key that has usage credits (more than the run spends): each
#       # request also spends one, in process or in the decision's own Redis call
#   TRACE=0.05 N=5000 benches/load/instructions.sh
#       # the same with `[tracing]` exporting at that sample_ratio (0 to 1) to the upstream
#       # nginx, which takes each OTLP export as a collector's receiver would (200): the
#       # export task's work counts, as it runs on the gateway's one worker
#   CRED=session N=5000 benches/load/instructions.sh
#   CRED=jwt N=5000 benches/load/instructions.sh
#       # the same on a session route, with an opaque session token, or with an
#       # identity provider's JWT (ES256, minted by tests/support/mint_jwt.mjs,
#       # its key set served on loopback): the cached-credential path of each
#
# Prints the total and the per-request figure, and leaves the callgrind file
# (for `callgrind_annotate`) in $OUT (default /tmp/mpg-instructions.out).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../lib.sh"
N=${N:-20000} WARM=${WARM:-2000} OUT=${OUT:-/tmp/mpg-instructions.out} RATE=${RATE:-}
BACKEND=${BACKEND:-local} H2=${H2:-} CRED=${CRED:-api_key} TRACE=${TRACE:-} CREDITS=${CREDITS:-}
case "$CRED" in
  api_key|session) ;;
  jwt) command -v node >/dev/null || { echo "instructions.sh: CRED=jwt needs node" >&2; exit 1; } ;;
  *) echo "instructions.sh: CRED is api_key, session or jwt" >&2; exit 1 ;;
esac
case "$BACKEND" in
  local) tools="valgrind callgrind_control nginx" ;;
  redis) tools="valgrind callgrind_control nginx redis-server" ;;
  *) echo "instructions.sh: BACKEND is local or redis" >&2; exit 1 ;;
esac
for tool in $tools; do
  command -v "$tool" >/dev/null || { echo "instructions.sh: needs $tool" >&2; exit 1; }
done
OHA="$(command -v oha || echo "$HOME/.cargo/bin/oha")"
[ -x "$OHA" ] || { echo "instructions.sh: needs oha (cargo install oha)" >&2; exit 1; }
# GW=path/to/mpg-gateway counts that binary (another build, or one with
# debug line tables for callgrind_annotate); else the release build.
if [ -z "${GW:-}" ]; then
  build_gateway
  GW="$ROOT/target/release/mpg-gateway"
fi

# The upstream nginx runs as a daemon: it is stopped through its pid file.
on_exit() { [ ! -f "$WORK/up/nginx.pid" ] || kill "$(cat "$WORK/up/nginx.pid")" 2>/dev/null; }
work_dir mpg-instr
UP_PORT=$(free_port); GW_PORT=$(free_port)

upstream_conf "$WORK/up" "$UP_PORT" '{"clusters":[]}'
nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" -g 'daemon on;'
wait_port "$UP_PORT"
LIMITER='backend = "local"'
if [ "$BACKEND" = redis ]; then
  REDIS_PORT=$(free_port)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$WORK" --logfile "$WORK/redis.log" &
  PIDS+=($!)
  wait_port "$REDIS_PORT"
  LIMITER="$(printf 'backend = "redis"\nredis_url = "redis://127.0.0.1:%s"' "$REDIS_PORT")"
fi

CFG="$WORK/gw.toml"
STORE="$(printf 'kind = "sqlite"\npath = "%s"' "$WORK/gateway.db")"
bench_config "$CFG" "$GW_PORT" "$UP_PORT" "$STORE" "$LIMITER"
seed_account "$CFG"
python3 "$HERE/lib/seed.py" "$WORK/gateway.db" acme alice 10 "$WORK/keys.txt" "$WORK/invalid.txt" \
  "$WORK/ids.txt" >/dev/null
KEY="$(head -n 1 "$WORK/keys.txt")"
[ -z "$CREDITS" ] || give_credits "$CFG" "$(head -n 1 "$WORK/ids.txt" | cut -d' ' -f2)"
URL="http://127.0.0.1:$GW_PORT/api/v1/clusters?organization_id=acme"
if [ "$CRED" != api_key ]; then
  # The same upstream behind a session route.
  cat >>"$CFG" <<EOF
[[routes]]
method = "GET"
path = "/api/v1/me/clusters"
auth = "session"
scope = "clusters:read"
organization = "query:organization_id"
upstream = "clusters"
rate_limit = "bench"
EOF
  URL="http://127.0.0.1:$GW_PORT/api/v1/me/clusters?organization_id=acme"
  KEY="$("$GW" sessions create --user alice --config "$CFG" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')"
fi
if [ "$CRED" = jwt ]; then
  IDP_PORT=$(free_port); mkdir -p "$WORK/idp"
  now=$(date +%s)
  printf '{"keys":[{"kid":"ec-1","type":"ec"}],"tokens":{"t":{"kid":"ec-1","alg":"ES256","claims":{"iss":"https://idp.bench","aud":"mpg-api","sub":"alice","iat":%s,"exp":%s}}}}' \
    "$now" "$((now + 3600))" | node "$ROOT/tests/support/mint_jwt.mjs" >"$WORK/minted.json"
  python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); json.dump({"keys": list(m["jwks"].values())}, open(sys.argv[2], "w")); print(m["tokens"]["t"])' \
    "$WORK/minted.json" "$WORK/idp/jwks.json" >"$WORK/token.txt"
  KEY="$(cat "$WORK/token.txt")"
  python3 -m http.server --bind 127.0.0.1 --directory "$WORK/idp" "$IDP_PORT" >/dev/null 2>&1 &
  PIDS+=($!)
  wait_port "$IDP_PORT"
  cat >>"$CFG" <<EOF
[auth.oidc]
issuer = "https://idp.bench"
audiences = ["mpg-api"]
jwks_url = "http://127.0.0.1:$IDP_PORT/jwks.json"
algorithms = ["ES256"]
EOF
fi

if [ -n "$TRACE" ]; then
  printf '[tracing]\notlp_endpoint = "http://127.0.0.1:%s"\nsample_ratio = %s\n' "$UP_PORT" "$TRACE" >>"$CFG"
fi

rm -f "$OUT" "$OUT".*
valgrind --tool=callgrind --callgrind-out-file="$OUT" "$GW" run --config "$CFG" >"$WORK/gw.log" 2>&1 &
VG=$!
PIDS+=("$VG")
wait_port "$GW_PORT" 60 # valgrind starts slowly
"$OHA" --no-tui ${H2:+--http2} -n "$WARM" -c 50 -H "Authorization: Bearer $KEY" "$URL" >/dev/null 2>&1
if [ "$BACKEND" = redis ]; then
  # The first Redis calls can miss redis_timeout while valgrind translates their code, and
  # the limiter then decides in-process for a second: let that second pass, and a probe
  # bring it back to Redis, before counting.
  sleep 2
  "$OHA" --no-tui ${H2:+--http2} -n 200 -c 50 -H "Authorization: Bearer $KEY" "$URL" >/dev/null 2>&1
fi
if [ -n "$CREDITS" ] && ! curl -s -D - -o /dev/null -H "Authorization: Bearer $KEY" "$URL" | grep -qi '^x-credits-remaining'; then
  echo "instructions.sh: the key with credits got no X-Credits-Remaining" >&2; exit 1
fi
callgrind_control -z "$VG" >/dev/null 2>&1
logged=$(wc -l <"$WORK/gw.log")
"$OHA" --no-tui ${H2:+--http2} -n "$N" -c 50 ${RATE:+-q "$RATE"} -H "Authorization: Bearer $KEY" "$URL" >"$WORK/oha.txt" 2>&1
grep -q 'Success rate:.*100.00%' "$WORK/oha.txt" || { echo "instructions.sh: requests failed" >&2; cat "$WORK/oha.txt" >&2; exit 1; }
callgrind_control -d "$VG" >/dev/null 2>&1
sleep 1
# The dump after zeroing is "$OUT.1" (callgrind numbers later parts).
total=$(awk '/^(summary|totals):/ {print $2; exit}' "$OUT.1")
echo "$N requests${H2:+ over h2c}${RATE:+ at $RATE/s} ($BACKEND limiter, $CRED${TRACE:+, traced at $TRACE}): $total instructions in the gateway's user space, $((total / N)) per request"
echo "callgrind file: $OUT.1 (callgrind_annotate --threshold=100 $OUT.1)"
# A Redis call that missed redis_timeout while counting sends a second of decisions to the
# in-process limiter, which costs less: such a count is not the Redis path's.
if [ "$BACKEND" = redis ] && tail -n +"$((logged + 1))" "$WORK/gw.log" | grep -q 'rate-limit backend'; then
  echo "instructions.sh: the limiter fell back to in-process decisions while counting; run again" >&2
  exit 1
fi
