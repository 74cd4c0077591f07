#!/usr/bin/env bash
# Redis's CPU time per call and per decision for the limiter's script
# (src/ratelimit/redis/batch.rs), on a Redis of its own on core 1 driven by
# redis-benchmark on core 0: one connection waiting for each answer (as the gateway's
# one call in flight) and 50 connections at once, with 1 and 20 decisions per call,
# and PING for the cost of a call alone. From Redis's INFO cpu, so it holds on a busy
# machine better than req/s does.
#
#   benches/load/redis_script_cost.sh        # N=40000 decisions per line
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_TAG=redis-script-cost
. "$HERE/../lib.sh"
N=${N:-40000}
work_dir redis-script-cost
PORT=$(free_port)
taskset -c 1 redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$WORK" --logfile "$WORK/redis.log" &
PIDS+=($!)
wait_port "$PORT"
cli() { redis-cli -p "$PORT" "$@"; }
cpu() { cli INFO cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }
SHA=$(cli SCRIPT LOAD "$(python3 -c "import sys; print(open(sys.argv[1]).read().split('r#\"', 1)[1].split('\"#', 1)[0])" \
  "$ROOT/src/ratelimit/redis/batch.rs")")
for conns in 1 50; do
  for batch in 1 20; do
    keys=() args=()
    for _ in $(seq "$batch"); do keys+=(bench:rl:0:k); args+=(250 1000000000000000 0); done
    calls=$((N / batch))
    c0=$(cpu)
    taskset -c 0 redis-benchmark -p "$PORT" -q -n "$calls" -c "$conns" EVALSHA "$SHA" "$batch" "${keys[@]}" "${args[@]}" >/dev/null
    c1=$(cpu)
    python3 -c "print('%2d connections, %2d decisions a call: %6.2f us a call, %5.2f us a decision' % ($conns, $batch, ($c1 - $c0) * 1e6 / $calls, ($c1 - $c0) * 1e6 / ($calls * $batch)))"
  done
done
c0=$(cpu)
taskset -c 0 redis-benchmark -p "$PORT" -q -n "$N" -c 1 PING >/dev/null
c1=$(cpu)
python3 -c "print(' 1 connection, PING: %6.2f us a call' % (($c1 - $c0) * 1e6 / $N))"
