#!/usr/bin/env bash
# Redis's instructions per script call and per request for the limiter's script
# (src/ratelimit/redis/script.rs), counted by valgrind's callgrind on a redis-server of its
# own: repeatable where Redis's CPU time from INFO is not. Calls are built as the gateway
# builds them (redis_script_cost.py): each request is the guard's peek then the policy's
# check, with 1 or 10 requests a call, from one client (hot keys: a call names each key
# once) or from a client of its own per request. Each figure is the difference between a
# run of CALLS + 500 calls and one of CALLS, over 500, so Redis's start-up drops out.
#
#   benches/load/redis_script_cost.sh             # CALLS=100; about a minute
#   CREDITS=1 benches/load/redis_script_cost.sh   # each request's key also spends a credit
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_TAG=redis-script-cost
. "$HERE/../lib.sh"
CALLS=${CALLS:-100} CREDITS=${CREDITS:-0}
for tool in valgrind redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "$SCRIPT: needs $tool" >&2; exit 1; }
done
work_dir redis-script-cost
python3 -c "import sys; print(open(sys.argv[1]).read().split('r#\"', 1)[1].split('\"#', 1)[0])" \
  "$ROOT/src/ratelimit/redis/script.rs" >"$WORK/script.lua"

# count CALLS PER_CALL CLIENTS: Redis's instructions over the whole run.
count() {
  local port out="$WORK/callgrind.out" _
  port=$(free_port)
  rm -f "$out"
  valgrind --tool=callgrind --callgrind-out-file="$out" redis-server --port "$port" \
    --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" --logfile "$WORK/redis.log" \
    >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  local sent=0
  python3 "$HERE/lib/redis_script_cost.py" "$port" "$WORK/script.lua" "$@" "$CREDITS" || sent=$?
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  # A refused call ends the run: a count of calls that did not run is no figure.
  [ "$sent" = 0 ] || return 1
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}

printf '%-18s %-10s %14s %16s\n' requests/call clients instr/call instr/request
for per_call in 1 10; do
  for clients in 1 1000; do
    a=$(count "$CALLS" "$per_call" "$clients")
    b=$(count $((CALLS + 500)) "$per_call" "$clients")
    printf '%-18s %-10s %14d %16d\n' "$per_call" "$clients" $(((b - a) / 500)) $(((b - a) / 500 / per_call))
  done
done
