#!/usr/bin/env bash
# Property-based check of docs/openapi.yaml and docs/openapi-admin.yaml against a real
# gateway, with schemathesis.
#
#   scripts/schemathesis.sh [GATEWAY_BINARY]      (default: target/debug/mpg-gateway)
#
# Builds nothing. Starts, in a temporary directory and on 127.0.0.1 only:
#   - a stub clusters upstream (python3 http.server) answering GET /api/v1/clusters with
#     200 {"data": []};
#   - the gateway, from a copy of config/gateway.toml: plain HTTP on a free loopback port,
#     the admin listener on another, SQLite store in the temp dir, local limiter with a
#     huge bucket;
# seeds it with the binary's admin commands (org acme, user alice as owner, a session
# token, an API key with clusters:read, an admin token), then runs schemathesis three
# times, since each endpoint family takes a different bearer credential: the `clusters`
# tag with the API key, the `api-keys` tag with the session token, and the admin API with
# the admin token. Everything it started is stopped on exit.
# Exit status: 0 when every run passes, 1 when schemathesis found a failure, 2 on a setup
# problem (missing binary, gateway that does not start, seeding that fails).
#
# Needs python3 (with venv). schemathesis 3.x is installed on first use into a private
# virtualenv (default ~/.cache/mpg-gateway/schemathesis-3) and reused afterwards.
#
# Environment: MPG_ST_PORT (gateway port, default a free one), MPG_ST_ADMIN_PORT (admin
# listener port, default a free one), MPG_ST_MAX_EXAMPLES (per
# operation, default 50), MPG_ST_KEEP=1 (keep the temp dir and print its path),
# MPG_ST_VENV (where the virtualenv lives), SCHEMATHESIS (a schemathesis 3.x `st` to use
# instead of the virtualenv's).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPEC="$ROOT/docs/openapi.yaml"
BASE_CONFIG="$ROOT/config/gateway.toml"
ADMIN_SPEC="$ROOT/docs/openapi-admin.yaml"
MAX_EXAMPLES="${MPG_ST_MAX_EXAMPLES:-50}"
SCHEMATHESIS_REQ='schemathesis>=3.30,<4'
HYPOTHESIS_REQ='hypothesis>=6.103.4,<6.170.10'

die() {
    echo "schemathesis.sh: $*" >&2
    exit 2
}

command -v python3 >/dev/null || die "python3 is required"
# Free loopback ports unless given: a fixed one may be held by anything else.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
PORT="${MPG_ST_PORT:-$(free_port)}"
ADMIN_PORT="${MPG_ST_ADMIN_PORT:-$(free_port)}"
while [[ "$ADMIN_PORT" == "$PORT" ]]; do ADMIN_PORT="$(free_port)"; done

# The gateway binary: as given (relative to the caller's directory), else the debug build.
if [[ $# -ge 1 ]]; then
    BIN="$1"
else
    BIN="$ROOT/target/debug/mpg-gateway"
fi
[[ -x "$BIN" ]] || die "no executable gateway at $BIN (build it first: cargo build)"
BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"
[[ -f "$SPEC" ]] || die "missing $SPEC"
[[ -f "$BASE_CONFIG" ]] || die "missing $BASE_CONFIG"
command -v python3 >/dev/null || die "python3 is required"

# schemathesis 3.x (this script uses its CLI; 4.x changed it), in a private virtualenv so
# the pins below hold whatever else is installed: hypothesis 6.170.10 dropped `many.more()`,
# which hypothesis-jsonschema 0.23 (schemathesis 3.x) calls. Installed once and reused
# while the pins are unchanged.
st_major() { "$@" --version 2>/dev/null | sed -n 's/.*version \([0-9][0-9]*\)\..*/\1/p' | head -n1; }
if [[ -n "${SCHEMATHESIS:-}" ]]; then
    ST=("$SCHEMATHESIS")
else
    VENV="${MPG_ST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mpg-gateway/schemathesis-3}"
    PINS="$SCHEMATHESIS_REQ $HYPOTHESIS_REQ"
    if [[ ! -x "$VENV/bin/st" || "$(cat "$VENV/.mpg-pins" 2>/dev/null)" != "$PINS" ]]; then
        echo "schemathesis.sh: installing $PINS into $VENV" >&2
        python3 -m venv "$VENV" || die "cannot create a virtualenv at $VENV (python3-venv missing?)"
        "$VENV/bin/python" -m pip install --quiet "$SCHEMATHESIS_REQ" "$HYPOTHESIS_REQ" \
            || die "cannot install $PINS"
        printf '%s' "$PINS" >"$VENV/.mpg-pins"
    fi
    ST=("$VENV/bin/st")
fi
major="$(st_major "${ST[@]}")"
[[ "$major" == 3 ]] || die "need schemathesis 3.x, found '${major:-none}' at ${ST[*]}"

# Refuse to start if something already holds a port: we would test the wrong server.
for p in "$PORT" "$ADMIN_PORT"; do
    if python3 - "$p" <<'PY'
import socket, sys
s = socket.socket()
s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
PY
    then
        die "127.0.0.1:$p is already in use (set MPG_ST_PORT or MPG_ST_ADMIN_PORT to another port)"
    fi
done

TMP="$(mktemp -d "${TMPDIR:-/tmp}/mpg-schemathesis.XXXXXX")"
STUB_PID=""
GW_PID=""
ST_PID=""

# Stops one process we started: TERM, up to 5 s to exit, then KILL.
stop() {
    local pid="$1"
    [[ -n "$pid" ]] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop "$ST_PID"
    stop "$GW_PID"
    stop "$STUB_PID"
    if [[ $rc -ne 0 && -s "$TMP/gateway.log" ]]; then
        echo "--- last lines of the gateway log ---" >&2
        tail -n 40 "$TMP/gateway.log" >&2 || true
    fi
    if [[ "${MPG_ST_KEEP:-0}" == 1 ]]; then
        echo "schemathesis.sh: kept $TMP" >&2
    else
        rm -rf "$TMP"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# 1. The stub clusters upstream, on a free port it reports through a file.
cat >"$TMP/upstream.py" <<'PY'
import http.server, json, sys

class Clusters(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path.split("?", 1)[0] == "/api/v1/clusters":
            self.answer(200, {"data": []})
        else:
            self.answer(404, {"error": "NotFound", "message": "no such resource"})

    def answer(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Clusters)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
server.serve_forever()
PY
python3 "$TMP/upstream.py" "$TMP/upstream.port" >"$TMP/upstream.log" 2>&1 &
STUB_PID=$!
for _ in $(seq 100); do
    [[ -s "$TMP/upstream.port" ]] && break
    kill -0 "$STUB_PID" 2>/dev/null || die "the stub upstream did not start: $(cat "$TMP/upstream.log")"
    sleep 0.1
done
[[ -s "$TMP/upstream.port" ]] || die "the stub upstream did not report its port"
UPSTREAM_PORT="$(cat "$TMP/upstream.port")"

# 2. The config: config/gateway.toml with the test settings swapped in (every other key,
#    the route table included, is kept as shipped).
CFG="$TMP/gateway.toml"
python3 - "$BASE_CONFIG" "$CFG" "$PORT" "$TMP" "$UPSTREAM_PORT" "$ADMIN_PORT" <<'PY'
import re, sys, tomllib

src, dst, port, tmp, upstream_port, admin_port = sys.argv[1:]
with open(src, "rb") as f:
    cfg = tomllib.load(f)

server = cfg.setdefault("server", {})
server["listen"] = f"127.0.0.1:{port}"
server["insecure_http"] = True
server.pop("tls", None)
server.setdefault("limits", {})["shutdown_grace"] = "2s"
cfg["admin"] = {"enabled": True, "listen": f"127.0.0.1:{admin_port}"}
cfg["log"] = {"level": "info", "format": "text"}
cfg["store"] = {"kind": "sqlite", "path": f"{tmp}/gateway.db"}
rl = cfg.setdefault("rate_limit", {})
rl["backend"] = "local"
rl.pop("redis_url", None)
policies = rl.setdefault("policies", {"default": {"per": "1m"}})
for policy in policies.values():
    policy["requests"] = 100000
    policy.setdefault("per", "1m")
rl["auth_failures"] = {"requests": 100000, "per": "1m"}
clusters = cfg.get("upstreams", {}).get("clusters")
if clusters is None or "targets" not in clusters:
    sys.exit("config/gateway.toml has no [upstreams.clusters] with targets")
clusters["targets"] = [f"http://127.0.0.1:{upstream_port}"]

def key(k):
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else '"' + k.replace("\\", "\\\\").replace('"', '\\"') + '"'

def value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise SystemExit(f"cannot write {type(v).__name__} values")

def is_table_list(v):
    return isinstance(v, list) and v and all(isinstance(x, dict) for x in v)

out = []
def table(path, d):
    scalars = [(k, v) for k, v in d.items() if not isinstance(v, dict) and not is_table_list(v)]
    if path and (scalars or not any(isinstance(v, dict) or is_table_list(v) for v in d.values())):
        out.append("[" + ".".join(key(p) for p in path) + "]")
    for k, v in scalars:
        out.append(f"{key(k)} = {value(v)}")
    if scalars:
        out.append("")
    for k, v in d.items():
        if isinstance(v, dict):
            table(path + [k], v)
        elif is_table_list(v):
            for item in v:
                out.append("[[" + ".".join(key(p) for p in path + [k]) + "]]")
                for ik, iv in item.items():
                    out.append(f"{key(ik)} = {value(iv)}")
                out.append("")

table([], cfg)
with open(dst, "w") as f:
    f.write("\n".join(out))
PY
if ! "$BIN" check-config --config "$CFG" >"$TMP/check-config.log" 2>&1; then
    cat "$TMP/check-config.log" >&2
    die "the generated config $CFG was refused"
fi

# 3. Seed the store. JSON on stdout goes to a file; secrets are read into variables and
#    never printed.
admin() {
    if ! "$BIN" "$@" --config "$CFG" >"$TMP/admin.json" 2>"$TMP/admin.err"; then
        cat "$TMP/admin.err" >&2
        die "admin command failed: $1 $2"
    fi
}
json_field() {
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$TMP/admin.json" "$1" \
        || die "admin command printed no JSON field $1"
}

admin migrate
admin orgs create --id acme --name "Acme Inc."
admin users create --id alice --email alice@example.com
admin members add --org acme --user alice --role owner
admin sessions create --user alice --ttl 1h
SESSION_TOKEN="$(json_field token)"
admin keys create --org acme --user alice --name schemathesis --scopes clusters:read
API_KEY="$(json_field key)"
admin admin-tokens create --name schemathesis
ADMIN_TOKEN="$(json_field token)"
rm -f "$TMP/admin.json"
[[ "$ADMIN_TOKEN" == mpga_* ]] || die "admin-tokens create gave no mpga_ token"
[[ "$SESSION_TOKEN" == mps_* ]] || die "sessions create gave no mps_ token"
[[ "$API_KEY" == mpg_* ]] || die "keys create gave no mpg_ key"

# 4. The gateway, and wait until it answers (an unrouted path: 404 without authentication).
"$BIN" run --config "$CFG" >"$TMP/gateway.log" 2>&1 &
GW_PID=$!
ready=0
for _ in $(seq 150); do
    kill -0 "$GW_PID" 2>/dev/null || die "the gateway exited during start-up"
    if python3 - "$PORT" <<'PY'
import http.client, sys
try:
    c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=1)
    c.request("GET", "/api/v1/__ready__")
    sys.exit(0 if c.getresponse().status == 404 else 1)
except OSError:
    sys.exit(1)
PY
    then
        ready=1
        break
    fi
    sleep 0.2
done
[[ $ready == 1 ]] || die "the gateway did not answer on 127.0.0.1:$PORT within 30 s"

# 5. Schemathesis, once per credential type. Both runs always happen; any failure fails.
#    The credentials belong to a throwaway store that is deleted on exit; schemathesis
#    prints `Authorization: [Filtered]` in its reports.
common=(
    --experimental=openapi-3.1
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance
    --hypothesis-max-examples="$MAX_EXAMPLES"
    --hypothesis-database=none
    --request-timeout=10000
    --validate-schema=true
)
# Run in the background and `wait`, so a TERM/INT to this script is handled at once.
run_schemathesis() {
    (cd "$TMP" && exec "${ST[@]}" "$@" "${common[@]}") &
    ST_PID=$!
    local rc=0
    wait "$ST_PID" || rc=$?
    ST_PID=""
    return "$rc"
}
status=0
api=(run "$SPEC" --base-url "http://127.0.0.1:$PORT/api/v1")
echo "== schemathesis: GET /clusters with the API key ==" >&2
run_schemathesis "${api[@]}" --include-tag clusters -H "Authorization: Bearer $API_KEY" || status=1
echo "== schemathesis: /api-keys endpoints with the session token ==" >&2
run_schemathesis "${api[@]}" --include-tag api-keys -H "Authorization: Bearer $SESSION_TOKEN" || status=1
echo "== schemathesis: the admin API with the admin token ==" >&2
run_schemathesis run "$ADMIN_SPEC" --base-url "http://127.0.0.1:$ADMIN_PORT/admin/v1" \
    -H "Authorization: Bearer $ADMIN_TOKEN" || status=1

if [[ $status -ne 0 ]]; then
    echo "schemathesis.sh: schemathesis reported failures (see above)" >&2
else
    echo "schemathesis.sh: every run passed" >&2
fi
exit "$status"
