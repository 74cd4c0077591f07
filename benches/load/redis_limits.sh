#!/usr/bin/env bash
# Redis-backed limits against the local limiter: the same gateway binary, the same job as
# the load suite's saturation scenario (one API key, a rate-limit policy that never fires,
# a small JSON from an nginx upstream), once with `[rate_limit] backend = "local"` and once
# with `backend = "redis"`, measured back to back in each round (in an order that turns
# from round to round) so the machine's noise hits both alike. Also Redis's own CPU time
# and script calls per request (from INFO, on a Redis of its own: stable where req/s is
# not), and the latency at a fixed offered load.
#
#   benches/load/redis_limits.sh [GATEWAY_BINARY...]   # default target/release/mpg-gateway
#   options: --runs N (3) --duration S (10) --conns C (50) --paced (add p50/p99 at half of
#            the local peak, h2load --h1 --rps) --no-saturation
#            --redis-cpus LIST (where Redis may run, as taskset -c takes it; 1)
#            --oha (the fixed-load runs with oha -q, as run.sh's, instead of h2load)
#            --rate R (the fixed load in req/s, instead of half of the local peak)
#            --probe (during each Redis-backed fixed-load run, bare round trips to Redis
#            from core 0, rtt_probe.py at 1 000 a second: the round trip at that load,
#            a floor under the gateway's wait where it reads below it; its PINGs count
#            in Redis's CPU)
#            --own-time (with the admin listener on, also the gateway's own p99 at the
#            fixed load, from its request-duration histogram, and the p99 of its wait
#            for Redis's decisions, from the backend-duration one: own_time.py)
#            --credits (each round also runs Redis-backed with a second key, one with
#            usage credits, more than any run spends: each request also spends one, in
#            the decision's own script call; its ratio is that key on Redis against the
#            plain key on the local limiter, beside the plain key's on Redis; the
#            fixed-load runs then use that key)
#            --slice S (saturation: each config's gateway runs for the whole round, idle
#            while another is loaded, and wrk turns from one to the next every S seconds
#            until each has had the run's duration: a host whose speed drifts over
#            seconds then moves every config of a round alike)
#            --gateway-cpu PCT (the gateway held to PCT% of core 0 by a cgroup CPU quota, in
#            10 ms periods, root only: its core, not the shared core 1, is then what limits
#            every config, as where Redis and the clients run on hosts of their own)
#
# Layout (2 cores): the gateway (`workers = 1`) alone on core 0; wrk or h2load, the
# upstream nginx and Redis on core 1 (Redis elsewhere with --redis-cpus). Several binaries
# (a baseline and a change) are measured in turn in every round. Prints one line per run
# and binary: req/s with each backend and their ratio, the gateway's CPU time per request
# (µs) with each, Redis's CPU time per request (µs), requests per script call and the
# gateway's sleeps (voluntary context switches) per request with each config; with
# --paced, per round and binary: p50/p99 (µs) with each backend at half of the local
# peak; at that load Redis's CPU per request, requests per call, Redis's CPU per call
# against its time in the script (µs), each core's busy share, with --probe the p99 (µs) of
# bare round trips to Redis from core 0 during the Redis-backed run, and the gateway's CPU
# time (µs) and its sleeps (voluntary context switches) per request with each backend.
# First, the latency of bare round trips from core 0 to Redis with all idle
# (redis-benchmark, when installed).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_TAG=redis-limits
. "$HERE/../lib.sh"
RUNS=3 DURATION=10 CONNS=50 PACED=0 OHA=0 OWN=0 RATE= SATURATION=1 REDIS_CPUS=1 PROBE=0 CREDITS=0 GW_CPU= SLICE= BINS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --conns) CONNS="$2"; shift ;;
    --paced) PACED=1 ;;
    --oha) PACED=1 OHA=1 ;;
    --rate) RATE="$2"; shift ;;
    --own-time) OWN=1 ;;
    --probe) PROBE=1 ;;
    --no-saturation) SATURATION=0 ;;
    --credits) CREDITS=1 ;;
    --redis-cpus) REDIS_CPUS="$2"; shift ;;
    --gateway-cpu) GW_CPU="$2"; shift ;;
    --slice) SLICE="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "$SCRIPT: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) BINS+=("$(realpath "$1")") ;;
  esac
  shift
done
[ ${#BINS[@]} -gt 0 ] || BINS=("$ROOT/target/release/mpg-gateway")
for b in "${BINS[@]}"; do [ -x "$b" ] || { echo "$SCRIPT: no gateway binary at $b" >&2; exit 2; }; done
case "$SLICE" in
  "") ;;
  [1-9]|[1-9][0-9]) [ "$SLICE" -le "$DURATION" ] ||
    { echo "$SCRIPT: --slice $SLICE is longer than --duration $DURATION" >&2; exit 2; } ;;
  *) echo "$SCRIPT: --slice takes whole seconds from 1 to 99, not $SLICE" >&2; exit 2 ;;
esac
for tool in wrk h2load nginx redis-server redis-cli taskset $([ "$OHA" = 1 ] && echo oha); do
  command -v "$tool" >/dev/null || { echo "$SCRIPT: $tool is needed" >&2; exit 2; }
done

work_dir redis-limits
# With --gateway-cpu: a cgroup of the bench's own whose CPU quota holds the gateway.
CAP_DIR=
if [ -n "$GW_CPU" ]; then
  case "$GW_CPU" in
    [1-9]|[1-9][0-9]|100) ;;
    *) echo "$SCRIPT: --gateway-cpu takes a whole percentage from 1 to 100, not $GW_CPU" >&2; exit 2 ;;
  esac
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then # cgroup v2
    grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
      echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    CAP_DIR="/sys/fs/cgroup/mpg-bench-$$"
    mkdir "$CAP_DIR" 2>/dev/null && echo "$((GW_CPU * 100)) 10000" >"$CAP_DIR/cpu.max" 2>/dev/null
  else # cgroup v1
    CAP_DIR="/sys/fs/cgroup/cpu/mpg-bench-$$"
    mkdir "$CAP_DIR" 2>/dev/null && echo 10000 >"$CAP_DIR/cpu.cfs_period_us" 2>/dev/null &&
      echo "$((GW_CPU * 100))" >"$CAP_DIR/cpu.cfs_quota_us" 2>/dev/null
  fi || { echo "$SCRIPT: --gateway-cpu needs a cgroup with the cpu controller it can write (root): $CAP_DIR" >&2; exit 2; }
fi
on_exit() { [ -z "$CAP_DIR" ] || rmdir "$CAP_DIR" 2>/dev/null || true; }
# cap_gateway: puts the running gateway in that cgroup (with --gateway-cpu).
cap_gateway() { [ -z "$CAP_DIR" ] || echo "$GW_PID" >"$CAP_DIR/cgroup.procs"; }
raise_nofile
UP_PORT=$(free_port); GW_PORT=$(free_port); REDIS_PORT=$(free_port); ADM_PORT=$(free_port)
PATH_Q="/api/v1/clusters?organization_id=acme"
URL="http://127.0.0.1:$GW_PORT$PATH_Q"

upstream_conf "$WORK/up" "$UP_PORT" '{"clusters":[{"id":"c1","name":"bench","status":"running"}]}'
taskset -c 1 nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
taskset -c "$REDIS_CPUS" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$WORK" --logfile "$WORK/redis.log" &
PIDS+=($!)
wait_port "$UP_PORT"
wait_port "$REDIS_PORT"
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }

for backend in local redis; do
  bench_config "$WORK/gw-$backend.toml" "$GW_PORT" "$UP_PORT" \
    "$(printf 'kind = "sqlite"\npath = "%s"\ncache_ttl = "10m"' "$WORK/gateway.db")" \
    "$(printf 'backend = "%s"\nredis_url = "redis://127.0.0.1:%s"' "$backend" "$REDIS_PORT")"
done
# The local config names no Redis url.
sed -i '/^redis_url = /d' "$WORK/gw-local.toml"
if [ "$OWN" = 1 ]; then
  sed -i "s|^enabled = false\$|listen = \"127.0.0.1:$ADM_PORT\"|" "$WORK/gw-local.toml" "$WORK/gw-redis.toml"
  grep -q "^listen = \"127.0.0.1:$ADM_PORT\"" "$WORK/gw-redis.toml" ||
    { echo "$SCRIPT: the bench config no longer has the [admin] enabled = false line" >&2; exit 1; }
fi
GW="${BINS[0]}"
seed_account "$WORK/gw-local.toml"
python3 "$HERE/lib/seed.py" "$WORK/gateway.db" acme alice 2 "$WORK/key.txt" "$WORK/invalid.txt" \
  "$WORK/ids.txt"
AUTH="Authorization: Bearer $(head -n 1 "$WORK/key.txt")"
# auth_for RUN: the key a run uses; the "credits" run (with --credits) is the Redis
# config with the key that has credits.
auth_for() { if [ "$1" = credits ]; then echo "$AUTH_CREDITS"; else echo "$AUTH"; fi; }
# The Redis-backed run of the fixed-load rounds: with --credits, the key with credits.
REDIS_RUN=redis
if [ "$CREDITS" = 1 ]; then
  REDIS_RUN=credits
  AUTH_CREDITS="Authorization: Bearer $(sed -n 2p "$WORK/key.txt")"
  give_credits "$WORK/gw-local.toml" "$(sed -n 2p "$WORK/ids.txt" | cut -d' ' -f2)"
  cp "$WORK/gw-redis.toml" "$WORK/gw-credits.toml"
fi

# Redis's CPU seconds (user + sys) and its script calls so far.
redis_cpu() { rcli INFO cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }
redis_calls() {
  rcli INFO commandstats | awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ {c += $3} END {print c + 0}'
}
# Redis's own time running the script so far (µs; commandstats' usec), the socket and
# event-loop work around it not counted.
redis_script_us() {
  rcli INFO commandstats | awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ {u += $5} END {print u + 0}'
}

# The gateway's CPU ticks (user + sys).
gw_ticks() { awk '{print $14 + $15}' "/proc/${1:-$GW_PID}/stat"; }
# The times the gateway went to sleep waiting for work (its voluntary context switches).
gw_sleeps() { awk '/^voluntary_ctxt_switches:/ {print $2}' "/proc/${1:-$GW_PID}/status"; }
CLK_TCK=$(getconf CLK_TCK)

# saturate BIN SLICE CONFIG...: for each CONFIG, in that order, "CONFIG REQ_PER_S
# REDIS_US_PER_REQ REQS_PER_CALL GATEWAY_US_PER_REQ GATEWAY_SLEEPS_PER_REQ", from wrk runs
# of SLICE seconds that turn from config to config until each has had DURATION seconds
# (one config with SLICE = DURATION: one run). Every config's gateway runs on a port of its
# own for the whole call, idle while another is loaded. Run in a subshell (as `< <(...)`):
# its trap stops the gateways on a failure too.
saturate() {
  GW="$1"
  local slice="$2" c port out left d cpu0 calls0
  shift 2
  local -A pid=() url=() auth=() t0=() s0=()
  SAT_PIDS=()
  trap 'for p in "${SAT_PIDS[@]}"; do stop "$p"; done' EXIT
  rm -f "$WORK/slices.txt"
  for c in "$@"; do
    port=$(free_port)
    sed "s|^listen = \"127.0.0.1:$GW_PORT\"\$|listen = \"127.0.0.1:$port\"|" "$WORK/gw-$c.toml" >"$WORK/gw-$c-sat.toml"
    run_gateway "$WORK/gw-$c-sat.toml" "$port" "$WORK/gateway.log" taskset -c 0
    cap_gateway
    SAT_PIDS+=("$GW_PID")
    pid[$c]=$GW_PID url[$c]="http://127.0.0.1:$port$PATH_Q" auth[$c]=$(auth_for "$c")
    check_key "${url[$c]}" "${auth[$c]}" "$c"
    taskset -c 1 wrk -t1 -c"$CONNS" -d2s -H "${auth[$c]}" "${url[$c]}" >/dev/null
  done
  for c in "$@"; do t0[$c]=$(gw_ticks "${pid[$c]}") s0[$c]=$(gw_sleeps "${pid[$c]}"); done
  for ((left = DURATION; left > 0; left -= d)); do
    d=$((slice < left ? slice : left))
    for c in "$@"; do
      cpu0=$(redis_cpu); calls0=$(redis_calls)
      out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${d}s" -H "${auth[$c]}" "${url[$c]}")
      grep -q "Non-2xx" <<<"$out" && { echo "$SCRIPT: non-2xx answers: $out" >&2; exit 1; }
      # The config, its requests and seconds, Redis's CPU seconds and script calls before
      # and after.
      echo "$c $(awk '/requests in/ {sub(/s,$/, "", $4); print $1, $4}' <<<"$out")" \
        "$cpu0 $(redis_cpu) $calls0 $(redis_calls)" >>"$WORK/slices.txt"
    done
  done
  # The config, the gateway's CPU ticks and sleeps over the call. Each gateway is stopped
  # here, not by the trap: the subshell may end in an exec of its last command, which
  # runs no trap, and a gateway left running holds the caller's pipe open.
  for c in "$@"; do
    echo "$c $(($(gw_ticks "${pid[$c]}") - t0[$c])) $(($(gw_sleeps "${pid[$c]}") - s0[$c]))" >>"$WORK/slices.txt"
    stop "${pid[$c]}"
  done
  python3 - "$WORK/slices.txt" "$CLK_TCK" "$@" <<'EOF'
import sys
n, secs, cpu, calls, ticks, sleeps = ({} for _ in range(6))
for line in open(sys.argv[1]):
    f = line.split()
    c = f[0]
    if len(f) == 3:
        ticks[c], sleeps[c] = int(f[1]), int(f[2])
        continue
    n[c] = n.get(c, 0) + int(f[1])
    secs[c] = secs.get(c, 0) + float(f[2])
    cpu[c] = cpu.get(c, 0) + float(f[4]) - float(f[3])
    calls[c] = calls.get(c, 0) + int(f[6]) - int(f[5])
for c in sys.argv[3:]:
    per_call = n[c] / calls[c] if calls[c] else 0
    print(c, f"{n[c] / secs[c]:.0f} {cpu[c] * 1e6 / n[c]:.2f} {per_call:.1f}",
          f"{ticks[c] / int(sys.argv[2]) * 1e6 / n[c]:.1f} {sleeps[c] / n[c]:.3f}")
EOF
}

# paced BIN BACKEND RATE: "P50_US P99_US" at RATE req/s offered (paced per connection).
paced() {
  GW="$1"
  run_gateway "$WORK/gw-$2.toml" "$GW_PORT" "$WORK/gateway.log" taskset -c 0
  cap_gateway
  local auth; auth=$(auth_for "$2")
  taskset -c 1 wrk -t1 -c"$CONNS" -d2s -H "$auth" "$URL" >/dev/null
  rm -f "$WORK/paced.log"
  local cpu0 calls0 script0 cpu1 calls1 script1 t0 t1 s0 s1
  cpu0=$(redis_cpu); calls0=$(redis_calls); script0=$(redis_script_us); head -3 /proc/stat >"$WORK/stat0"
  t0=$(gw_ticks); s0=$(gw_sleeps)
  [ "$OWN" = 0 ] || curl -sf "http://127.0.0.1:$ADM_PORT/metrics" >"$WORK/m0.txt"
  # Beside the Redis-backed run, bare round trips to the same Redis from the gateway's
  # core (1 000 a second): the round trip the gateway's wait for Redis stands on.
  local probe=""
  if [ "$2" = redis ] && [ "$PROBE" = 1 ]; then
    taskset -c 0 python3 "$HERE/lib/rtt_probe.py" "$REDIS_PORT" 1000 "$DURATION" >"$WORK/probe.json" &
    probe=$!
  fi
  if [ "$OHA" = 1 ]; then
    # As run.sh's fixed loads: oha's bursts on its 1 ms ticks, its own lateness counted.
    taskset -c 1 oha --no-tui --output-format json --latency-correction -z "${DURATION}s" -q "$3" \
      -c "$CONNS" -H "$auth" "$URL" >"$WORK/paced.log" 2>"$WORK/paced.out" ||
      { cat "$WORK/paced.out" >&2; exit 1; }
  else
    taskset -c 1 h2load --h1 -t1 -c "$CONNS" --rps "$(python3 -c "print(round($3 / $CONNS, 3))")" \
      -D "$DURATION" -H "$auth" --log-file "$WORK/paced.log" "$URL" >"$WORK/paced.out" 2>&1 ||
      { cat "$WORK/paced.out" >&2; exit 1; }
  fi
  cpu1=$(redis_cpu); calls1=$(redis_calls); script1=$(redis_script_us); head -3 /proc/stat >"$WORK/stat1"
  t1=$(gw_ticks); s1=$(gw_sleeps)
  local own=- wait=- rtt=-
  if [ -n "$probe" ] && wait "$probe"; then
    rtt=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["p99_us"])' <"$WORK/probe.json")
  fi
  if [ "$OWN" = 1 ]; then
    curl -sf "http://127.0.0.1:$ADM_PORT/metrics" >"$WORK/m1.txt"
    p99() { python3 -c 'import json, sys; print(json.load(sys.stdin)["own_p99_us"])'; }
    own=$(python3 "$HERE/lib/own_time.py" "$WORK/m0.txt" "$WORK/m1.txt" 1 | p99)
    [ "$2" = local ] || wait=$(python3 "$HERE/lib/own_time.py" "$WORK/m0.txt" "$WORK/m1.txt" 1 \
      mpg_rate_limit_backend_duration_seconds 'backend="redis"' | p99)
  fi
  stop "$GW_PID"
  echo -n "$own $wait $rtt "
  python3 - "$WORK/paced.log" "$cpu0" "$cpu1" "$calls0" "$calls1" "$WORK/stat0" "$WORK/stat1" \
    "$script0" "$script1" "$(((t1 - t0) * 1000000 / CLK_TCK))" "$((s1 - s0))" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
if text.startswith("{"):  # oha's report: its percentiles, its count of 2xx
    d = json.loads(text)
    p, n = d["latencyPercentiles"], d["statusCodeDistribution"].get("200", 0)
    p50, p99 = round(p["p50"] * 1e6), round(p["p99"] * 1e6)
else:  # h2load's log: one line per request, its status and its time (µs)
    ok = sorted(int(l.split("\t")[2]) for l in text.splitlines() if l.strip() and l.split("\t")[1] == "200")
    n, p50, p99 = len(ok), ok[len(ok) // 2], ok[min(len(ok) - 1, int(len(ok) * 0.99))]
cpu, calls = float(sys.argv[3]) - float(sys.argv[2]), int(sys.argv[5]) - int(sys.argv[4])
script = int(sys.argv[9]) - int(sys.argv[8])
# Each core's busy share over the run (/proc/stat: idle and iowait are not busy).
busy = []
for a, b in zip(open(sys.argv[6]).readlines()[1:], open(sys.argv[7]).readlines()[1:]):
    d = [int(y) - int(x) for x, y in zip(a.split()[1:], b.split()[1:])]
    busy.append(f"{100 * (1 - (d[3] + d[4]) / sum(d)):.0f}%")
print(p50, p99, f"{cpu * 1e6 / n:.2f}", f"{n / calls:.1f}" if calls else "-",
      f"{cpu * 1e6 / calls:.1f}/{script / calls:.1f}" if calls else "-", *busy,
      f"{int(sys.argv[10]) / n:.1f}", f"{int(sys.argv[11]) / n:.3f}")
EOF
}

log "gateway on core 0${GW_CPU:+ (at most $GW_CPU% of it)}, wrk/h2load + nginx on core 1, Redis on cores $REDIS_CPUS; $RUNS x ${DURATION}s, $CONNS connections"
# The floor under what Redis adds: bare round trips from the gateway's core, all idle.
if command -v redis-benchmark >/dev/null; then
  log "a bare round trip from core 0 to Redis: $(redis_round_trip -p "$REDIS_PORT")"
fi
declare -A LOCAL_RPS
if [ "$SATURATION" = 1 ]; then
  # The configs of a round, and the order they run in: it turns by one each round, so
  # that a drift within a round (the host's, or the gateway's own state) does not always
  # fall on the same config.
  CONFIGS=(local redis)
  [ "$CREDITS" = 0 ] || CONFIGS+=(credits)
  printf '%-4s %-28s %9s %9s %6s %9s %9s %9s %9s %11s' run binary local_rps redis_rps ratio \
    gw_us_loc gw_us_red redis_us reqs/call sleeps/req
  [ "$CREDITS" = 0 ] || printf ' %9s %6s %9s %9s' cred_rps ratio gw_us_cred redis_us
  echo
  for r in $(seq "$RUNS"); do
    for bin in "${BINS[@]}"; do
      declare -A RPS=() RUS=() PER_CALL=() GWUS=() SLEEPS=()
      order=()
      for i in "${!CONFIGS[@]}"; do order+=("${CONFIGS[$(((i + r - 1) % ${#CONFIGS[@]}))]}"); done
      # With --slice, the round's configs in one call, taking turns; else one call each.
      calls=("${order[*]}")
      [ -n "$SLICE" ] || calls=("${order[@]}")
      for configs in "${calls[@]}"; do
        # shellcheck disable=SC2086 # a call's configs, one word each
        while read -r c rps rus per_call gwus sleeps; do
          RPS[$c]=$rps RUS[$c]=$rus PER_CALL[$c]=$per_call GWUS[$c]=$gwus SLEEPS[$c]=$sleeps
        done < <(saturate "$bin" "${SLICE:-$DURATION}" $configs)
      done
      LOCAL_RPS[$bin]="${LOCAL_RPS[$bin]:-} ${RPS[local]}"
      sleeps="${SLEEPS[local]}/${SLEEPS[redis]}"
      [ "$CREDITS" = 0 ] || sleeps="$sleeps/${SLEEPS[credits]}"
      printf '%-4s %-28s %9.0f %9.0f %6.3f %9s %9s %9s %9s %11s' "$r" "$(basename "$bin")" \
        "${RPS[local]}" "${RPS[redis]}" "$(python3 -c "print(${RPS[redis]} / ${RPS[local]})")" \
        "${GWUS[local]}" "${GWUS[redis]}" "${RUS[redis]}" "${PER_CALL[redis]}" "$sleeps"
      if [ "$CREDITS" = 1 ]; then
        printf ' %9.0f %6.3f %9s %9s' "${RPS[credits]}" \
          "$(python3 -c "print(${RPS[credits]} / ${RPS[local]})")" "${GWUS[credits]}" "${RUS[credits]}"
      fi
      echo
    done
  done
fi

if [ "$PACED" = 1 ]; then
  # One rate for every binary, so that their latencies compare: half of the median local
  # peak over all of them (from the saturation runs, or one run each).
  peaks="${LOCAL_RPS[*]:-}"
  if [ -n "$RATE" ]; then
    peaks=$((RATE * 2))
  elif [ -z "${peaks// /}" ]; then
    for bin in "${BINS[@]}"; do
      read -r _ peak _ < <(saturate "$bin" "$DURATION" local)
      peaks="$peaks $peak"
    done
  fi
  rate=$(python3 -c "import statistics; print(int(statistics.median([float(x) for x in '$peaks'.split()]) / 2))")
  printf '%-4s %-24s %6s %9s %9s %9s %9s %8s %9s %11s %11s %11s %11s %10s %10s %11s %11s\n' run binary rate \
    local_p50 local_p99 redis_p50 redis_p99 redis_us reqs/call call/script busy_local busy_redis own_p99 \
    wait_p99 probe_p99 gw_us sleeps/req
  for r in $(seq "$RUNS"); do
    for bin in "${BINS[@]}"; do
      read -r lown _ _ lp50 lp99 _ _ _ lb0 lb1 lgw lsl < <(paced "$bin" local "$rate")
      read -r rown rwait rtt rp50 rp99 rus per_call split rb0 rb1 rgw rsl < <(paced "$bin" "$REDIS_RUN" "$rate")
      printf '%-4s %-24s %6s %9s %9s %9s %9s %8s %9s %11s %11s %11s %11s %10s %10s %11s %11s\n' "$r" \
        "$(basename "$bin")" "$rate" "$lp50" "$lp99" "$rp50" "$rp99" "$rus" "$per_call" "$split" \
        "$lb0/$lb1" "$rb0/$rb1" "$lown/$rown" "$rwait" "$rtt" "$lgw/$rgw" "$lsl/$rsl"
    done
  done
fi
