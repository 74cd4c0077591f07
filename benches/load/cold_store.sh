#!/usr/bin/env bash
# The cold key store: a gateway on PostgreSQL (workers = 1, pinned to core 0) with N keys
# seeded (100 000 by default). Each round starts a fresh gateway, sends every key once
# (cold: each key seen for the first time, so a store lookup each), then every key once
# more (warm: all cached), back to back, with wrk on core 1; PostgreSQL runs where the
# machine puts it. Prints, per round, both throughputs and their ratio, the PostgreSQL
# transactions per key during the cold pass (pg_stat_database: every lookup query is one;
# the usage stamps add a few), the gateway's RSS after the warm pass, its CPU per request
# in each pass and PostgreSQL's CPU per key in the cold pass (all `postgres` processes of
# this machine, from /proc). A pass is timed from its first response to its last
# (key_pass.sh, which the load suite's cold-store scenario uses too).
#
# usage: benches/load/cold_store.sh [--rounds N] [--keys N] [--conns N]
#   GW=PATH      the gateway binary (default: target/release/mpg-gateway, built if absent)
#   PG_URL=URL   the PostgreSQL server (default: $MPG_TEST_PG_URL, else
#                postgres://postgres@127.0.0.1:5432/test); a database of its own is
#                created there and dropped at the end.
#   PG_SSLMODE=MODE  the gateway's sslmode to it (default: disable; see pg_db_url in ../lib.sh)
# Everything listens on 127.0.0.1. Needs wrk, nginx, psql, python3, taskset.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../lib.sh"
. "$HERE/lib/key_pass.sh"
LOG_TAG=cold_store
ROUNDS=3 KEYS=100000 CONNS=64
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --keys) KEYS="$2"; shift 2 ;;
    --conns) CONNS="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$SCRIPT: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
PG_URL="${PG_URL:-${MPG_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/test}}"
GW="${GW:-$ROOT/target/release/mpg-gateway}"
[ -x "$GW" ] || { log "building the gateway"; build_gateway; }

work_dir cold_store
raise_nofile
DB="mpg_cold_$$"
DB_URL="$(pg_db_url "$PG_URL" "$DB")"
psql -q "$PG_URL" -c "CREATE DATABASE $DB" >/dev/null
on_exit() { psql -q "$PG_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1; }

UP_PORT="$(free_port)" GW_PORT="$(free_port)"
upstream_conf "$WORK/up" "$UP_PORT" '{"clusters":[]}'
taskset -c 1 nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
wait_port "$UP_PORT"

bench_config "$WORK/gw.toml" "$GW_PORT" "$UP_PORT" \
  "$(printf 'kind = "postgres"\nurl = "%s"\ncache_ttl = "10m"\nnegative_cache_ttl = "10m"' "$DB_URL")" \
  'backend = "local"'
seed_account "$WORK/gw.toml"

log "seeding $KEYS keys into PostgreSQL"
python3 - "$HERE/lib" "$KEYS" "$WORK/keys.txt" "$WORK/rows.csv" <<'EOF'
import hashlib, sys, time
sys.path.insert(0, sys.argv[1])
from seed import base62, new_key
n, keys_out, rows_out = int(sys.argv[2]), sys.argv[3], sys.argv[4]
now = int(time.time())
with open(keys_out, "w") as keys, open(rows_out, "w") as rows:
    for i in range(n):
        key = new_key()
        keys.write(key + "\n")
        digest = hashlib.sha256(key.encode()).hexdigest()
        rows.write(f"key_{base62(16)},{digest},{key[4:12]},bench-{i},acme,alice,clusters:read,{now}\n")
EOF
psql -q "$DB_URL" -c "\\copy api_keys (id, key_hash, prefix, name, organization_id, user_id, scopes, created_at) FROM '$WORK/rows.csv' WITH (FORMAT csv)"
psql -q "$DB_URL" -c "VACUUM ANALYZE api_keys" >/dev/null

key_pass_lua "$WORK/pass.lua"
URL="http://127.0.0.1:$GW_PORT/api/v1/clusters?organization_id=acme"
xacts() { psql -Atq "$DB_URL" -c "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"; }
# pass NAME: key_pass over every key, and the gateway's CPU per response in NAME_gw_us.
pass() {
  local t0 t1
  t0="$(proc_ticks "$GW_PID")"
  key_pass "$1" "$WORK/pass.lua" "$WORK/keys.txt" "$URL" "$CONNS"
  t1="$(proc_ticks "$GW_PID")"
  local n_var="$1_n"
  printf -v "$1_gw_us" %s "$(awk -v t=$((t1 - t0)) -v hz="$HZ" -v n="${!n_var}" 'BEGIN {printf "%.1f", t / hz / n * 1e6}')"
}
HZ="$(getconf CLK_TCK)"

printf '%-6s %10s %10s %7s %10s %9s %10s %10s %10s\n' round cold_rps warm_rps ratio xacts/key \
  rss_mib gw_us_cold gw_us_warm pg_us_key
for round in $(seq "$ROUNDS"); do
  run_gateway "$WORK/gw.toml" "$GW_PORT" "$WORK/gw.log" taskset -c 0
  before="$(xacts)"
  pg0="$(postgres_ticks)"
  pass cold
  pg1="$(postgres_ticks)"
  sleep 1 # the statistics collector reports with a delay
  after="$(xacts)"
  pass warm
  rss="$(rss_kib "$GW_PID")"
  stop "$GW_PID"
  [ "$cold_err" = 0 ] && [ "$warm_err" = 0 ] ||
    log "round $round: $cold_err cold and $warm_err warm errors"
  awk -v r="$round" -v c="$cold_rps" -v w="$warm_rps" -v x=$((after - before)) -v n="$cold_n" \
    -v rss="$rss" -v gc="$cold_gw_us" -v gw="$warm_gw_us" -v pg=$((pg1 - pg0)) -v hz="$HZ" \
    'BEGIN {printf "%-6s %10d %10d %7.2f %10.3f %9.1f %10.1f %10.1f %10.1f\n", r, c, w, c / w, x / n,
      rss / 1024, gc, gw, pg / hz / n * 1e6}'
done
