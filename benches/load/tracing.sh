#!/usr/bin/env bash
# What tracing costs: the same gateway binary and the same job as the load suite's
# saturation scenario (one API key, a rate-limit policy that never fires, a small JSON
# from an nginx upstream), with `[tracing]` off, at `sample_ratio = 0.05` and at 1.0,
# measured back to back in each round (in a rotating order) so the machine's noise hits
# all three alike. The traced runs export to a live OTLP receiver: a second nginx that
# reads each export's body and answers 200, as a collector's receiver does.
#
#   benches/load/tracing.sh [GATEWAY_BINARY]   # default target/release/mpg-gateway
#   options: --runs N (3) --duration S (10) --conns C (50)
#
# Layout (2 cores): the gateway (`workers = 1`) alone on core 0; wrk, the upstream and
# the receiver on core 1. Prints per run: req/s off, at 0.05 and at 1.0 and their ratios
# to off, the gateway's CPU time per request (µs, user + system, from /proc) with each and
# the ratios of off's to theirs (what throughput becomes where the gateway's core is the
# limit, steadier than req/s on a shared machine), and the exports the receiver took;
# then the median ratios. Fails if a traced gateway dropped spans
# (`mpg_trace_spans_dropped_total`) or the receiver got nothing.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_TAG=tracing
. "$HERE/../lib.sh"
RUNS=3 DURATION=10 CONNS=50 GW=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --conns) CONNS="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "$SCRIPT: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) GW="$(realpath "$1")" ;;
  esac
  shift
done
[ -n "$GW" ] || GW="$ROOT/target/release/mpg-gateway"
[ -x "$GW" ] || { echo "$SCRIPT: no gateway binary at $GW" >&2; exit 2; }
for tool in wrk nginx taskset curl; do
  command -v "$tool" >/dev/null || { echo "$SCRIPT: $tool is needed" >&2; exit 2; }
done

work_dir tracing
raise_nofile
UP_PORT=$(free_port); GW_PORT=$(free_port); RX_PORT=$(free_port); ADM_PORT=$(free_port)
PATH_Q="/api/v1/clusters?organization_id=acme"
URL="http://127.0.0.1:$GW_PORT$PATH_Q"

upstream_conf "$WORK/up" "$UP_PORT" '{"clusters":[{"id":"c1","name":"bench","status":"running"}]}'
taskset -c 1 nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
# The receiver: every POST's body read whole, 200, and one access-log line per export.
mkdir -p "$WORK/rx"
cat >"$WORK/rx/nginx.conf" <<EOF
worker_processes 1;
pid $WORK/rx/nginx.pid;
error_log $WORK/rx/error.log warn;
events { worker_connections 1024; }
http {
  access_log $WORK/rx/exports.log;
  client_max_body_size 0;
  client_body_buffer_size 16m;
  client_body_temp_path $WORK/rx; proxy_temp_path $WORK/rx; fastcgi_temp_path $WORK/rx;
  uwsgi_temp_path $WORK/rx; scgi_temp_path $WORK/rx;
  server {
    listen 127.0.0.1:$RX_PORT;
    location = /v1/traces { client_body_in_single_buffer on; return 200; }
  }
}
EOF
taskset -c 1 nginx -p "$WORK/rx" -c "$WORK/rx/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
wait_port "$UP_PORT"
wait_port "$RX_PORT"

bench_config "$WORK/gw-off.toml" "$GW_PORT" "$UP_PORT" \
  "$(printf 'kind = "sqlite"\npath = "%s"\ncache_ttl = "10m"' "$WORK/gateway.db")" 'backend = "local"'
# The admin listener on in all three (metrics are recorded only with it on), for the
# traced runs' count of dropped spans.
sed -i "s|^enabled = false\$|listen = \"127.0.0.1:$ADM_PORT\"|" "$WORK/gw-off.toml"
for ratio in 0.05 1.0; do
  cp "$WORK/gw-off.toml" "$WORK/gw-$ratio.toml"
  printf '[tracing]\notlp_endpoint = "http://127.0.0.1:%s"\nsample_ratio = %s\n' \
    "$RX_PORT" "$ratio" >>"$WORK/gw-$ratio.toml"
done
grep -q "^listen = \"127.0.0.1:$ADM_PORT\"" "$WORK/gw-1.0.toml" ||
  { echo "$SCRIPT: the bench config no longer has the [admin] enabled = false line" >&2; exit 1; }
seed_account "$WORK/gw-off.toml"
python3 "$HERE/lib/seed.py" "$WORK/gateway.db" acme alice 1 "$WORK/key.txt" "$WORK/invalid.txt"
AUTH="Authorization: Bearer $(cat "$WORK/key.txt")"

CLK_TCK=$(getconf CLK_TCK)
# saturate MODE: "REQ_PER_S CPU_US_PER_REQ" of one wrk run against the gateway with
# config MODE.
saturate() {
  run_gateway "$WORK/gw-$1.toml" "$GW_PORT" "$WORK/gateway.log" taskset -c 0
  curl -sf -o /dev/null -H "$AUTH" "$URL" || { echo "$SCRIPT: the gateway refused the bench key" >&2; exit 1; }
  taskset -c 1 wrk -t1 -c"$CONNS" -d2s -H "$AUTH" "$URL" >/dev/null
  local out t0 t1
  t0=$(awk '{print $14 + $15}' "/proc/$GW_PID/stat")
  out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -H "$AUTH" "$URL")
  t1=$(awk '{print $14 + $15}' "/proc/$GW_PID/stat")
  grep -q "Non-2xx" <<<"$out" && { echo "$SCRIPT: non-2xx answers: $out" >&2; exit 1; }
  if [ "$1" != off ]; then
    sleep 1 # the last batch
    local dropped
    dropped=$(curl -sf "http://127.0.0.1:$ADM_PORT/metrics" |
      awk '/^mpg_trace_spans_dropped_total/ {print $2}')
    [ "${dropped:-0}" = 0 ] || { echo "$SCRIPT: $1: $dropped spans dropped" >&2; exit 1; }
  fi
  stop "$GW_PID"
  local rps reqs
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  python3 -c "print($rps, ($t1 - $t0) / $CLK_TCK * 1e6 / $reqs)"
}

declare -A RUN
ORDERS=("off 0.05 1.0" "0.05 1.0 off" "1.0 off 0.05")
RATIOS="$WORK/ratios.txt"
for r in $(seq 1 "$RUNS"); do
  exports0=$(wc -l <"$WORK/rx/exports.log" 2>/dev/null || echo 0)
  for mode in ${ORDERS[$(((r - 1) % 3))]}; do
    RUN[$mode]=$(saturate "$mode")
  done
  exports1=$(wc -l <"$WORK/rx/exports.log")
  [ "$exports1" -gt "$exports0" ] || { echo "$SCRIPT: the receiver got no export" >&2; exit 1; }
  python3 -c "
(off, coff), (low, clow), (full, cfull) = ($(tr ' ' , <<<"${RUN[off]}")), ($(tr ' ' , <<<"${RUN[0.05]}")), ($(tr ' ' , <<<"${RUN[1.0]}"))
print(f'run $r: req/s off {off:.0f}, 0.05 {low:.0f} ({low / off:.3f}x), 1.0 {full:.0f} ({full / off:.3f}x); '
      f'CPU us/req off {coff:.2f}, 0.05 {clow:.2f} ({coff / clow:.3f}x), 1.0 {cfull:.2f} ({coff / cfull:.3f}x); '
      f'{$exports1 - $exports0} exports')
print(low / off, full / off, coff / clow, coff / cfull, file=open('$RATIOS', 'a'))"
done
python3 -c "
import statistics
rows = [tuple(map(float, l.split())) for l in open('$RATIOS')]
m = lambda i: statistics.median(r[i] for r in rows)
print(f'median of untraced: req/s 0.05 {m(0):.3f}x, 1.0 {m(1):.3f}x; by CPU per request 0.05 {m(2):.3f}x, 1.0 {m(3):.3f}x')"
