#!/usr/bin/env bash
# Runs docs/walkthrough.md's single-instance steps (3 to 10: certificate,
# upstream, check, store, first request, metrics, sign-in with an identity
# provider, provisioning over the admin API) as a reader would, in a scratch
# copy of config/, and fails unless each step gives the answer the page
# promises. The page's fixed ports (8443, 9000, 9100, 9901) must be free.
#
#   bash scripts/walkthrough.sh target/debug/mpg-gateway
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
GW="$(cd "$(dirname "${1:?usage: walkthrough.sh path/to/mpg-gateway}")" && pwd)/$(basename "$1")"
for tool in curl jq node openssl python3; do
  command -v "$tool" >/dev/null || { echo "walkthrough.sh: needs $tool" >&2; exit 1; }
done
for port in 8443 9000 9100 9901; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "walkthrough.sh: port $port is in use; the walkthrough needs it" >&2
    exit 1
  fi
done

WORK="$(mktemp -d /tmp/mpg-walkthrough.XXXXXX)"
cleanup() {
  # Whatever the steps left running (they stop their own on success).
  pkill -f "http.server 9000 --bind 127.0.0.1 --directory /tmp/clusters" 2>/dev/null || true
  pkill -f "http.server 9100 --bind 127.0.0.1 --directory /tmp/idp" 2>/dev/null || true
  pkill -f "$GW run" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/tests"
cp -r "$ROOT/config" "$WORK/"
cp -r "$ROOT/tests/support" "$WORK/tests/"
rm -rf "$WORK/config/tls" "$WORK"/config/instance-*.toml
mkdir -p "$WORK/bin"
ln -s "$GW" "$WORK/bin/mpg-gateway"

# The page's shell blocks of steps 3 to 10, in order, in one shell.
python3 - "$ROOT/docs/walkthrough.md" >"$WORK/steps.sh" <<'PY'
import re, sys
page = open(sys.argv[1]).read()
steps = page[page.index("## 3. "):page.index("## 11. ")]
print("\n".join(re.findall(r"```sh\n(.*?)```", steps, re.S)))
PY
cd "$WORK"
PATH="$WORK/bin:$PATH" bash -e steps.sh >"$WORK/out.txt" 2>"$WORK/err.txt" || {
  echo "walkthrough.sh: a step failed" >&2; tail -n 30 "$WORK/err.txt" >&2; exit 1
}

# What the page says each step answers.
expect() {
  # Both files as grep's own arguments: `cat | grep -q` would fail under pipefail
  # whenever grep stops reading early.
  grep -qF -- "$1" "$WORK/out.txt" "$WORK/err.txt" || {
    echo "walkthrough.sh: $2: expected $1 in:" >&2; cat "$WORK/out.txt" >&2; exit 1
  }
}
expect 'config/gateway.toml: OK' "step 5, check-config"
expect '{"data":[]}' "step 7, the first request"
expect '"name":"deploy"' "step 7, a key made with the session"
expect 'x-credits-remaining: 999' "step 7, a trial key's first call spends one of its credits"
expect 'mpg_requests_total{route="/api/v1/clusters",method="GET",status="200"}' "step 8, metrics"
expect 'config/instance-sso.toml: OK' "step 9, check-config with [auth.oidc]"
expect '"name":"ci","organization_id":"acme"' "step 9, alice's keys listed with her JWT"
expect '{"organization_id":"globex","role":"member","user_id":"bob"}' "step 10, a membership over the admin API"
expect '{"data":[],"next_cursor":null}' "step 10, bob's session from the admin API"
echo "walkthrough.sh: steps 3 to 10 of docs/walkthrough.md give the answers the page promises"
