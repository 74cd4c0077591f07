#!/usr/bin/env bash
# The fault suite's serving phases: the release gateway on 127.0.0.1 with a small
# keep-alive target (target.py), each phase bounded in time. docs/operations.md holds
# the figures of a run.
#
#   upstream  the target refuses connections for OUTAGE seconds (10) under h2load load
#             (50 connections): lines and bytes the gateway logs (level "warn", the
#             default summary interval), requests answered meanwhile; then the target
#             is back: time until the gateway answers 200 from it again.
#   drain     50 keep-alive clients (25 on a response whose body is still coming, 25
#             looping on short ones) when SIGTERM arrives: how each connection ended
#             (on a Connection: close response, or its next request meeting EOF/RST),
#             the responses completed after the signal, and the drain's duration.
#   memory    the gateway's RSS idle, holding CONNS (10 000) idle keep-alive
#             connections (benches/load/lib/hold_conns.py), and 1, 5 and 15 s after
#             they close; twice. The environment's MIMALLOC_PURGE_DELAY reaches the
#             gateway (the systemd unit sets it to 0).
#
#   benches/faults/serving.sh                 # all three phases (about 2 minutes)
#   benches/faults/serving.sh drain memory    # some of them
#   options: --gateway PATH (default target/release/mpg-gateway, built if missing)
#            --outage SECS --conns N --workers N (the gateway's [server] workers; 0: one per core)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_TAG=faults
. "$HERE/../lib.sh"
GW="$ROOT/target/release/mpg-gateway" OUTAGE=10 CONNS=10000 WORKERS=0 PHASES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gateway) GW="$2"; shift ;;
    --outage) OUTAGE="$2"; shift ;;
    --conns) CONNS="$2"; shift ;;
    --workers) WORKERS="$2"; shift ;;
    upstream|drain|memory) PHASES+=("$1") ;;
    -h|--help) usage; exit 0 ;;
    *) echo "serving.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#PHASES[@]} -gt 0 ] || PHASES=(upstream drain memory)
command -v h2load >/dev/null || { echo "serving.sh: needs h2load (apt-get install nghttp2-client)" >&2; exit 1; }
[ -x "$GW" ] || { log "building the gateway (release)"; build_gateway; }

work_dir mpg-faults-serving
now_ms() { date +%s%3N; }

UP_PORT=$(free_port) GW_PORT=$(free_port)
start_target() { # -> UP_PID
  python3 "$HERE/lib/target.py" "$UP_PORT" 1 >/dev/null &
  UP_PID=$!; PIDS+=("$UP_PID")
  wait_port "$UP_PORT"
}
cat >"$WORK/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$GW_PORT"
insecure_http = true
workers = $WORKERS
[admin]
enabled = false
[log]
level = "warn"
format = "json"
[store]
path = "$WORK/gateway.db"
[upstreams.backend]
targets = ["http://127.0.0.1:$UP_PORT"]
EOF
for path in /public/ping /slow /fast; do
  printf '[[routes]]\nmethod = "GET"\npath = "%s"\nauth = "none"\nupstream = "backend"\nrate_limit = "none"\n' "$path" >>"$WORK/gateway.toml"
done
start_gateway() { # -> GW_PID; its log in $WORK/gateway.log
  : >"$WORK/gateway.log"
  run_gateway "$WORK/gateway.toml" "$GW_PORT" "$WORK/gateway.log"
}
status() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$GW_PORT/public/ping"; }
RESULTS=()

phase_upstream() {
  log "upstream: the target refuses connections for ${OUTAGE} s under load"
  start_target
  start_gateway
  [ "$(status)" = 200 ] || { echo "serving.sh: the gateway did not answer 200" >&2; exit 1; }
  stop "$UP_PID"
  local lines0 bytes0
  lines0=$(wc -l <"$WORK/gateway.log"); bytes0=$(wc -c <"$WORK/gateway.log")
  h2load --h1 -c 50 -t 1 -D "$OUTAGE" "http://127.0.0.1:$GW_PORT/public/ping" >"$WORK/h2load.txt" 2>&1 || true
  local lines bytes warns requests
  lines=$(( $(wc -l <"$WORK/gateway.log") - lines0 )); bytes=$(( $(wc -c <"$WORK/gateway.log") - bytes0 ))
  warns=$(tail -n "$lines" "$WORK/gateway.log" | grep -c '"level":"WARN"' || true)
  requests=$(awk '/^requests:/ {print $6}' "$WORK/h2load.txt")
  log "  ${requests} requests answered (502/503) in ${OUTAGE} s; ${lines} log lines (${warns} WARN), ${bytes} bytes"
  tail -n "$lines" "$WORK/gateway.log" | awk 'NR <= 20 { print "    " $0 }' >&2
  log "upstream: the target is back"
  start_target
  local back=$(now_ms) tries=0
  while [ "$(status)" != 200 ]; do
    tries=$((tries + 1))
    [ "$tries" -lt 3000 ] || { echo "serving.sh: the target was not used again within 30 s" >&2; exit 1; }
    sleep 0.01
  done
  local reuse=$(( $(now_ms) - back ))
  sleep 0.2
  log "  answered 200 from it again ${reuse} ms after it was back"
  grep '"incident":"recovered"' "$WORK/gateway.log" | sed 's/^/    /' >&2 || true
  RESULTS+=("{\"phase\":\"upstream\",\"outage_s\":$OUTAGE,\"requests_during_outage\":${requests:-0},\"log_lines\":$lines,\"warn_lines\":$warns,\"log_bytes\":$bytes,\"ms_until_used_again\":$reuse}")
  stop "$GW_PID"; stop "$UP_PID"
}

phase_drain() {
  log "drain: SIGTERM with 50 keep-alive clients (25 mid-body, 25 on short responses)"
  start_target
  start_gateway
  local out
  out=$(python3 "$HERE/lib/drain_clients.py" 127.0.0.1 "$GW_PORT" "$GW_PID" 25 25)
  wait "$GW_PID" 2>/dev/null || true
  log "  $out"
  RESULTS+=("{\"phase\":\"drain\",\"clients\":$out}")
  stop "$UP_PID"
}

# hold_spike ROUND: opens $CONNS idle keep-alive connections, measures, closes them,
# measures 1, 5 and 15 s later; appends the figures to $SPIKES.
hold_spike() {
  local held open after1 after5 after15
  hold_open "$GW_PORT" "$CONNS" /public/ping none
  held=$HELD
  sleep 1
  open=$(rss_kib "$GW_PID")
  hold_close
  sleep 1; after1=$(rss_kib "$GW_PID")
  sleep 4; after5=$(rss_kib "$GW_PID")
  sleep 10; after15=$(rss_kib "$GW_PID")
  log "  spike $1: ${held} connections open ${open} KiB; closed: ${after1} KiB (1 s), ${after5} KiB (5 s), ${after15} KiB (15 s)"
  SPIKES+="${SPIKES:+,}{\"connections\":$held,\"open\":$open,\"closed_1s\":$after1,\"closed_5s\":$after5,\"closed_15s\":$after15}"
}

phase_memory() {
  log "memory: RSS with ${CONNS} idle keep-alive connections, after they close, and a second time"
  log "  (MIMALLOC_PURGE_DELAY=${MIMALLOC_PURGE_DELAY:-unset}, workers = $WORKERS)"
  start_target
  start_gateway
  [ "$(status)" = 200 ] || { echo "serving.sh: the gateway did not answer 200" >&2; exit 1; }
  local idle
  idle=$(rss_kib "$GW_PID")
  log "  RSS idle ${idle} KiB"
  SPIKES=""
  hold_spike 1
  hold_spike 2
  RESULTS+=("{\"phase\":\"memory\",\"purge_delay\":\"${MIMALLOC_PURGE_DELAY:-unset}\",\"workers\":$WORKERS,\"rss_idle_kib\":$idle,\"spikes_kib\":[$SPIKES]}")
  stop "$GW_PID"; stop "$UP_PID"
}

for p in "${PHASES[@]}"; do "phase_$p"; done
printf '%s\n' "${RESULTS[@]}"
