# Shell helpers shared by the bench and fault scripts (benches/load/*.sh,
# benches/faults/store.sh, benches/faults/serving.sh).
# Sourced after the script's own `set -euo pipefail`; defines functions and ROOT, runs
# nothing else. Everything it starts listens on 127.0.0.1.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPT="${0##*/}"
LOG_TAG="${LOG_TAG:-bench}"

# The script's header comment (line 2 down to its `set -euo`), for --help.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d'; }

log() { printf '[%s %s] %s\n' "$LOG_TAG" "$(date +%H:%M:%S)" "$*" >&2; }

# build_gateway [CARGO ARGS...]: a release build of the gateway (RUSTFLAGS from the
# caller's environment), quiet unless it fails; then again without --locked, to show why.
build_gateway() {
  (cd "$ROOT" && cargo build --release --locked --bin mpg-gateway "$@" >/dev/null 2>&1) \
    || (cd "$ROOT" && cargo build --release --bin mpg-gateway "$@")
}

# build_bench NAME: builds the bench benches/NAME.rs (release, as the gateway) and
# prints the path of its executable.
build_bench() {
  local out
  out=$(cd "$ROOT" && cargo build --release --bench "$1" --message-format=json 2>/dev/null) ||
    { (cd "$ROOT" && cargo build --release --bench "$1") >&2; return 1; }
  python3 -c '
import json, sys
exe = [m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]]
print(exe[-1])' "$1" <<<"$out"
}

# pg_db_url SERVER_URL DB: the URL of database DB on the PostgreSQL server of SERVER_URL
# (its own database part dropped). Without TLS unless PG_SSLMODE says otherwise: the
# store on loopback, as on one host, so that its figures are the lookups', not TLS's
# (PG_SSLMODE=prefer, sqlx's default, takes TLS where the server offers it).
pg_db_url() { echo "${1%/*}/$2?sslmode=${PG_SSLMODE:-disable}"; }

# work_dir NAME: a fresh $WORK (/tmp/NAME.XXXXXX) and an empty $PIDS. On exit, and on
# INT or TERM, every process in $PIDS is ended and waited for, then the script's own
# `on_exit` runs if it defines one, then $WORK is removed (kept if KEEP_WORK=1).
work_dir() {
  WORK="$(mktemp -d "/tmp/$1.XXXXXX")"
  PIDS=()
  trap cleanup EXIT INT TERM
}
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if declare -F on_exit >/dev/null; then on_exit || true; fi
  if [ "${KEEP_WORK:-0}" = 1 ]; then log "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}

# Raises the open-files limit for many connections: to 65536, or as far as allowed.
raise_nofile() { ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"; }

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# wait_port PORT [SECONDS]: until something accepts on 127.0.0.1:PORT (20 s at most,
# or SECONDS); exits the script if nothing does.
wait_port() {
  local _
  for _ in $(seq $((${2:-20} * 20))); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "$SCRIPT: nothing listens on 127.0.0.1:$1" >&2
  exit 1
}

# run_gateway CONFIG PORT LOG [COMMAND PREFIX...]: runs $GW with CONFIG in the
# background, its log appended to LOG, until stopped or the script exits; returns once it
# listens on PORT. Sets GW_PID.
run_gateway() {
  local config="$1" port="$2" logfile="$3"
  shift 3
  "$@" "$GW" run --config "$config" 2>>"$logfile" &
  GW_PID=$!; PIDS+=("$GW_PID")
  wait_port "$port"
}

# stop PID: ends a process and waits for it, whether or not it is still running.
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

# redis_round_trip REDIS-BENCHMARK-TARGET...: bare round trips (PING, one at a time) from
# core 0 to a Redis (`-u URL` or `-p PORT`), as one JSON line, or `null` when none came
# back within 60 s (redis-benchmark retries a Redis it cannot reach for ever).
redis_round_trip() {
  local out
  out=$(timeout 60 taskset -c 0 redis-benchmark "$@" -c 1 -n 10000 -t ping_mbulk --csv 2>/dev/null |
    python3 "$ROOT/benches/load/lib/redis_rtt.py") || out=null
  echo "$out"
}

# upstream_conf DIR PORT BODY: DIR/nginx.conf for the upstream the suites proxy to, an
# nginx answering every request on 127.0.0.1:PORT with the JSON BODY, keep-alive, no
# access log; its pid file, logs and temporary files in DIR.
upstream_conf() {
  mkdir -p "$1/logs"
  cat >"$1/nginx.conf" <<EOF
worker_processes 1;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  client_body_temp_path $1; proxy_temp_path $1; fastcgi_temp_path $1;
  uwsgi_temp_path $1; scgi_temp_path $1;
  server {
    listen 127.0.0.1:$2;
    location / { default_type application/json; return 200 '$3'; }
  }
}
EOF
}

# seed_account CONFIG [COMMAND PREFIX...]: migrates the store CONFIG names and creates
# organization acme with alice as a member, whom the suites' keys belong to. The prefix
# (nice, taskset) runs each gateway command; the migration speaks only if it fails.
seed_account() {
  local config="$1" out
  shift
  out="$("$@" "$GW" migrate --config "$config" 2>&1)" || { echo "$out" >&2; return 1; }
  "$@" "$GW" orgs create --id acme --name Acme --config "$config" >/dev/null
  "$@" "$GW" users create --id alice --email alice@example.com --config "$config" >/dev/null
  "$@" "$GW" members add --org acme --user alice --role member --config "$config" >/dev/null
}

# give_credits CONFIG KEY_ID: gives the key more usage credits than any run spends (no
# refill) with the gateway's own `keys update`, so that each of its requests also spends one.
give_credits() {
  "$GW" keys update "$2" --credits 4000000000000000 --config "$1" >/dev/null
}

# check_key URL AUTH [credits]: the gateway at URL takes AUTH's key; with `credits`, it
# also answers with the key's count (X-Credits-Remaining), so that its requests spend
# them. Else the script stops.
check_key() {
  local head
  head=$(curl -sf -D - -o /dev/null -H "$2" "$1") ||
    { echo "$SCRIPT: the gateway at $1 refused the bench key" >&2; exit 1; }
  [ "${3:-}" != credits ] || grep -qi '^x-credits-remaining' <<<"$head" ||
    { echo "$SCRIPT: the key with credits got no X-Credits-Remaining from $1" >&2; exit 1; }
}

# hold_open PORT N PATH KEY [COMMAND PREFIX...]: N idle keep-alive connections to the
# gateway on 127.0.0.1:PORT, each idle after one request for PATH with `Bearer KEY`,
# opened by benches/load/lib/hold_conns.py and held until hold_close (120 s at most). Sets
# HOLD_PID, and HELD: how many were answered 200 (waited for 60 s at most).
hold_open() {
  local port="$1" n="$2" path="$3" key="$4" _
  shift 4
  rm -f "$WORK/hold.in"; mkfifo "$WORK/hold.in"
  "$@" python3 "$ROOT/benches/load/lib/hold_conns.py" 127.0.0.1 "$port" "$n" "$path" "$key" 120 \
    <"$WORK/hold.in" >"$WORK/hold.out" &
  HOLD_PID=$!; PIDS+=("$HOLD_PID")
  exec 7>"$WORK/hold.in"
  for _ in $(seq 600); do grep -q '^ready' "$WORK/hold.out" 2>/dev/null && break; sleep 0.1; done
  HELD=$(awk '/^ready/ {print $2}' "$WORK/hold.out"); HELD=${HELD:-0}
}
# hold_close: closes hold_conns.py's stdin, on which it closes every connection and exits.
hold_close() { exec 7>&-; stop "$HOLD_PID"; }

# bench_route UP_PORT: the end of every bench config, on stdout: the policy `bench`, too
# large ever to fire (the figures are the cost of deciding), and the one route GET
# /api/v1/clusters, keyed and limited by it, to the upstream on UP_PORT.
bench_route() {
  cat <<EOF
[rate_limit.policies.bench]
requests = 4000000000
per = "1s"
[upstreams.clusters]
targets = ["http://127.0.0.1:$1"]
[[routes]]
method = "GET"
path = "/api/v1/clusters"
auth = "api_key"
scope = "clusters:read"
organization = "query:organization_id"
upstream = "clusters"
rate_limit = "bench"
EOF
}

# bench_config FILE GW_PORT UP_PORT STORE RATE_LIMIT [SERVER]: the gateway config of the
# single-scenario scripts: one worker, no admin listener, warn logs and [bench_route].
# STORE and RATE_LIMIT are the bodies of [store] and [rate_limit]; SERVER ends [server]
# (default: plain HTTP).
bench_config() {
  local file="$1" gw_port="$2" up_port="$3" store="$4" limiter="$5"
  local server="${6:-insecure_http = true}"
  {
    cat <<EOF
[server]
listen = "127.0.0.1:$gw_port"
workers = 1
$server
[admin]
enabled = false
[log]
level = "warn"
[store]
$store
[rate_limit]
$limiter
EOF
    bench_route "$up_port"
  } >"$file"
}

# self_signed DIR: DIR/cert.pem and DIR/key.pem, an ECDSA P-256 certificate for
# localhost and 127.0.0.1 (the load suite's TLS certificate).
self_signed() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$1/key.pem" -out "$1/cert.pem" 2>/dev/null
}
