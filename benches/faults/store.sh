#!/usr/bin/env bash
# Key store faults, rerunnable on one machine: everything on 127.0.0.1, every phase
# bounded in time, and the suite stops by itself (about 2 minutes, plus the build).
#
#   benches/faults/store.sh            # a 10 s outage under load, then a 60 s flood of unknown keys
#   benches/faults/store.sh --quick    # a 4 s outage, a 10 s flood (validation)
#   options: --bin PATH      the gateway to measure (default: cargo build --release)
#            --conns C       h2load connections in the outage phase (default 64)
#            --keys K        cached keys the load cycles through (default 4)
#            --outage S --flood S --flood-conns C --no-outage --no-flood --out DIR
#            --keep          keep the work directory (logs, h2load's per-request files)
#            --control       the outage phase's timeline and checks without cutting the store
#                            (what the checks themselves cost the load; store-control.json)
#
# Needs PostgreSQL (MPG_TEST_PG_URL, default postgres://postgres@127.0.0.1:5432/test; a
# database is created for the run and dropped after), nginx (the upstream), h2load
# (apt-get install nghttp2-client) and python3. With 2 cores or more the gateway runs
# alone on core 0 (`workers = 1`), everything else on core 1.
#
# Outage: the gateway reaches PostgreSQL through store_tools.py's proxy, with
# cache_ttl = 5s, stale_if_error = 60s, query_timeout = 2s. h2load (HTTP/1.1, one process
# per key) runs for 8 s + the outage + 6 s; after 8 s the proxy stops listening (connects
# are refused in well under a millisecond) and drops every connection, and listens again
# after the outage. Reported: throughput, p50/p99/max and the slowest second before,
# during and after the outage; an unseen key's 503 (and Retry-After) during it; once the
# store is back, how long until a key created during the outage is served and a key
# revoked during it is refused; the breaker's metrics and log lines.
#
# Flood: a fresh gateway (PostgreSQL direct, negative_cache_ttl = 5s, the per-IP
# brute-force guard lifted as for a flood from many addresses) gets random well-formed
# API keys (the checksum is right, the store knows none) on 64 connections; one request
# in 100 carries a valid key. Reported: rate, the gateway's RSS and negative cache
# entries every 5 s, and 8 s after negative_cache_ttl has passed since the flood ended.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_TAG=faults
. "$HERE/../lib.sh"
TOOLS="$HERE/lib/store_tools.py"
BEFORE=8 AFTER=6 OUTAGE=10 FLOOD=60 CONNS=64 KEYS=4 FLOOD_CONNS=64
DO_OUTAGE=1 DO_FLOOD=1 GW="" OUT="$HERE/results" KEEP_WORK=0 CONTROL=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) OUTAGE=4 FLOOD=10 ;;
    --bin) GW="$2"; shift ;;
    --conns) CONNS="$2"; shift ;;
    --keys) KEYS="$2"; shift ;;
    --outage) OUTAGE="$2"; shift ;;
    --flood) FLOOD="$2"; shift ;;
    --flood-conns) FLOOD_CONNS="$2"; shift ;;
    --no-outage) DO_OUTAGE=0 ;;
    --no-flood) DO_FLOOD=0 ;;
    --out) OUT="$2"; shift ;;
    --keep) KEEP_WORK=1 ;;
    --control) CONTROL=1 DO_FLOOD=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "store.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ "$OUTAGE" -ge 3 ] || { echo "store.sh: --outage must be at least 3 (seconds)" >&2; exit 2; }
for tool in h2load nginx python3 psql; do
  command -v "$tool" >/dev/null || { echo "store.sh: needs $tool (h2load: apt-get install nghttp2-client)" >&2; exit 1; }
done

PG_ADMIN="${MPG_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
PG_HOSTPORT="$(python3 -c 'import sys,urllib.parse as u; p=u.urlsplit(sys.argv[1]); print(p.hostname, p.port or 5432)' "$PG_ADMIN")"
read -r PG_HOST PG_PORT <<<"$PG_HOSTPORT"
case "$PG_HOST" in 127.0.0.1|localhost) ;; *) echo "store.sh: PostgreSQL must be on loopback, not $PG_HOST" >&2; exit 2 ;; esac
# PG_ADMIN with its database replaced (query string kept), and with its host:port replaced.
pg_url() {
  python3 - "$@" <<'PY'
import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1])._replace(path="/" + sys.argv[2])
if len(sys.argv) > 3:
    user = p.netloc.rsplit("@", 1)[0] + "@" if "@" in p.netloc else ""
    p = p._replace(netloc=f"{user}127.0.0.1:{sys.argv[3]}")
print(u.urlunsplit(p))
PY
}

if [ -z "$GW" ]; then
  log "building the gateway (release)"
  build_gateway
  GW="$ROOT/target/release/mpg-gateway"
fi

# ---------------------------------------------------------------- workspace, cleanup
DB="mpg_faults_$(date +%s)_$$"
on_exit() { psql -q "$PG_ADMIN" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1; }
work_dir mpg-faults-store
mkdir -p "$OUT"
raise_nofile
now_us() { date +%s%6N; }
# The gateway alone on core 0, the rest on core 1, when there are two cores.
PIN_GW=() PIN_REST=() WORKERS=0
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  PIN_GW=(taskset -c 0) PIN_REST=(taskset -c 1) WORKERS=1
fi
# The suite's own checks during the load (CLI commands, one-off requests) run at the
# lowest priority, so that starting them does not take the load generator's core.
QUIET=(nice -n 19 "${PIN_REST[@]}")

# ---------------------------------------------------------------- upstream, store
UP_PORT=$(free_port) GW_PORT=$(free_port) ADM_PORT=$(free_port) PROXY_PORT=$(free_port)
upstream_conf "$WORK/up" "$UP_PORT" '{"clusters":[]}'
"${PIN_REST[@]}" nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
wait_port "$UP_PORT"
psql -q "$PG_ADMIN" -c "CREATE DATABASE $DB" >/dev/null
DIRECT_URL="$(pg_url "$PG_ADMIN" "$DB")"
PROXIED_URL="$(pg_url "$PG_ADMIN" "$DB" "$PROXY_PORT")"
"${PIN_REST[@]}" python3 "$TOOLS" proxy "$PROXY_PORT" "$PG_PORT" >"$WORK/proxy.log" 2>&1 &
PROXY_PID=$!
PIDS+=($PROXY_PID)
wait_port "$PROXY_PORT"

# config STORE_URL: the gateway's config on stdout.
config() {
  cat <<EOF
[server]
listen = "127.0.0.1:$GW_PORT"
insecure_http = true
workers = $WORKERS
[server.limits]
max_connections = 20000
idle_timeout = "300s"
[admin]
listen = "127.0.0.1:$ADM_PORT"
[log]
level = "info,access=off"
format = "json"
[store]
kind = "postgres"
url = "$1"
cache_ttl = "5s"
negative_cache_ttl = "5s"
stale_if_error = "60s"
query_timeout = "2s"
[rate_limit]
backend = "local"
# A flood from many addresses: the per-IP guard would stop one address's flood early.
[rate_limit.auth_failures]
requests = 4000000000
per = "1s"
EOF
  bench_route "$UP_PORT"
}
config "$DIRECT_URL" >"$WORK/direct.toml"
config "$PROXIED_URL" >"$WORK/proxied.toml"
cli() { "${QUIET[@]}" "$GW" "$@" --config "$WORK/direct.toml"; }
new_key() { cli keys create --org acme --user alice --name "$1" --scopes clusters:read | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["key"], r["id"])'; }
seed_account "$WORK/direct.toml" "${QUIET[@]}"
LOAD_KEYS=()
for i in $(seq "$KEYS"); do read -r k _ <<<"$(new_key "load-$i")"; LOAD_KEYS+=("$k"); done
read -r REVOKED REVOKED_ID <<<"$(new_key revoked-during-outage)"
read -r UNSEEN _ <<<"$(new_key never-seen)"

# start_gateway CONFIG LOG: runs the gateway alone on its core until cleanup; sets GW_PID.
start_gateway() { run_gateway "$1" "$GW_PORT" "$2" "${PIN_GW[@]}"; }
stop_gateway() { kill "$GW_PID"; wait "$GW_PID" 2>/dev/null || true; }
metric_lines() { python3 -c 'import sys,urllib.request as r; print("\n".join(l for l in r.urlopen(sys.argv[1]).read().decode().splitlines() if not l.startswith("#") and any(l.startswith(n) for n in sys.argv[2:])))' "http://127.0.0.1:$ADM_PORT/metrics" "$@"; }

# ---------------------------------------------------------------- outage under load
if [ "$DO_OUTAGE" = 1 ]; then
  log "outage: ${BEFORE} s of load, ${OUTAGE} s with connects refused, ${AFTER} s after ($CONNS connections, $KEYS keys)"
  start_gateway "$WORK/proxied.toml" "$WORK/gw-outage.log"
  # The change follower clears the cache when it starts; then every key is cached.
  sleep 1
  for k in "${LOAD_KEYS[@]}" "$REVOKED"; do python3 "$TOOLS" once "$GW_PORT" "$k" >/dev/null; done
  DURATION=$((BEFORE + OUTAGE + AFTER))
  PER_KEY=$(( (CONNS + KEYS - 1) / KEYS ))
  H2=()
  for i in "${!LOAD_KEYS[@]}"; do
    "${PIN_REST[@]}" h2load --h1 -t 1 -c "$PER_KEY" -D "$DURATION" \
      -H "authorization: Bearer ${LOAD_KEYS[$i]}" --log-file="$WORK/h2load-$i.log" \
      "http://127.0.0.1:$GW_PORT/api/v1/clusters?organization_id=acme" >"$WORK/h2load-$i.out" 2>&1 &
    H2+=($!)
    PIDS+=($!)
  done
  sleep "$BEFORE"
  [ "$CONTROL" = 1 ] || kill -USR1 "$PROXY_PID"
  CUT_US=$(now_us)
  # sleep_to SECONDS: sleeps until SECONDS after the cut, to the millisecond.
  sleep_to() { python3 -c "import time; time.sleep(max(0, ($CUT_US + $1 * 1000000) / 1e6 - time.time()))"; }
  PROBES=()
  sleep_to 1
  log "store cut off: an unseen key, and a key revoked and one created while the gateway cannot see it"
  # In the background, so that a gateway which makes them wait keeps the outage's length.
  for i in 1 2 3; do "${QUIET[@]}" python3 "$TOOLS" once "$GW_PORT" "$UNSEEN" >"$WORK/unseen-$i.txt" & PROBES+=($!); done
  "${QUIET[@]}" python3 "$TOOLS" once "$GW_PORT" "$REVOKED" >"$WORK/stale.txt" &
  PROBES+=($!)
  sleep_to 2
  cli keys revoke "$REVOKED_ID" >/dev/null
  read -r CREATED _ <<<"$(new_key created-during-outage)"
  wait "${PROBES[@]}"
  UNSEEN_503=("$(cat "$WORK/unseen-1.txt")" "$(cat "$WORK/unseen-2.txt")" "$(cat "$WORK/unseen-3.txt")")
  STALE="$(cat "$WORK/stale.txt")"
  sleep_to "$OUTAGE"
  [ "$CONTROL" = 1 ] || kill -USR2 "$PROXY_PID"
  BACK_US=$(now_us)
  "${QUIET[@]}" python3 "$TOOLS" until "$GW_PORT" "$CREATED" 200 5 >"$WORK/created.ms" &
  UNTIL=($!)
  "${QUIET[@]}" python3 "$TOOLS" until "$GW_PORT" "$REVOKED" 401 5 >"$WORK/revoked.ms" &
  UNTIL+=($!)
  wait "${H2[@]}" || true
  END_US=$(now_us)
  wait "${UNTIL[@]}"
  log "phases (milliseconds)"
  python3 "$TOOLS" phases "$CUT_US" "$BACK_US" "$END_US" "$WORK/phases.json" "$WORK"/h2load-*.log
  BREAKER="$(metric_lines mpg_store_breaker_ | tr '\n' ';')"
  OPEN_LINES=$(grep -c 'key store circuit open' "$WORK/gw-outage.log" || true)
  CLOSE_LINES=$(grep -c 'circuit closed' "$WORK/gw-outage.log" || true)
  WARN_LINES=$(grep -c '"level":"WARN"' "$WORK/gw-outage.log" || true)
  stop_gateway
  RESULT="$OUT/store-outage.json"
  [ "$CONTROL" = 0 ] || RESULT="$OUT/store-control.json"
  python3 - "$WORK/phases.json" "$RESULT" "$OUTAGE" "$CONNS" "$KEYS" "$STALE" \
    "$(cat "$WORK/created.ms")" "$(cat "$WORK/revoked.ms")" "$BREAKER" "$OPEN_LINES" "$CLOSE_LINES" \
    "$WARN_LINES" "${UNSEEN_503[@]}" <<'PY'
import json, sys
phases = json.load(open(sys.argv[1]))
(out, outage, conns, keys, stale, created, revoked, breaker, opened, closed, warns), unseen = sys.argv[2:13], sys.argv[13:]
result = {
    "outage_s": int(outage), "connections": int(conns), "keys": int(keys),
    "phases": phases,
    "unseen_key_during_outage": [dict(zip(("status", "ms", "retry_after"), u.split())) for u in unseen],
    "revoked_key_during_outage": dict(zip(("status", "ms", "retry_after"), stale.split())),
    "after_store_back_ms": {"key_created_during_outage_served": created, "key_revoked_during_outage_refused": revoked},
    "breaker_metrics": [m for m in breaker.split(";") if m],
    "log_lines": {"circuit_open": int(opened), "circuit_closed": int(closed), "warn_total": int(warns)},
}
json.dump(result, open(out, "w"), indent=1)
print(json.dumps({k: v for k, v in result.items() if k != "phases"}, indent=1))
PY
fi

# ---------------------------------------------------------------- flood of unknown keys
if [ "$DO_FLOOD" = 1 ]; then
  log "flood: ${FLOOD} s of unknown well-formed keys on $FLOOD_CONNS connections"
  start_gateway "$WORK/direct.toml" "$WORK/gw-flood.log"
  sleep 1
  python3 "$TOOLS" once "$GW_PORT" "${LOAD_KEYS[0]}" >/dev/null
  "${PIN_REST[@]}" python3 "$TOOLS" flood "$GW_PORT" "$FLOOD" "$FLOOD_CONNS" "${LOAD_KEYS[0]}" \
    "$GW_PID" "$ADM_PORT" 13 "$OUT/store-flood.json"
  stop_gateway
fi
log "done; figures in $OUT"
