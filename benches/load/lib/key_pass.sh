# Sourced by cold_store.sh and run.sh: one pass over a list of keys, each key sent once
# by wrk (one thread, on core 1), timed from the first response to the last. wrk waits
# out -d after its Lua stops it, and its own figures would count that wait: the pass is
# timed by the two files it touches, at the first response and at the last one. Both the
# cold pass and the warm pass go through here, so they cost the load generator the same.

# key_pass_lua FILE: writes the pass's wrk script to FILE.
key_pass_lua() {
  cat >"$1" <<'EOF'
local reqs = {}
for key in io.lines(os.getenv("BENCH_KEYS")) do
  reqs[#reqs + 1] = wrk.format("GET", nil, { ["Host"] = wrk.host .. ":" .. wrk.port, ["Authorization"] = "Bearer " .. key })
end
local i, seen, bad = 0, 0, 0
request = function()
  i = i % #reqs + 1
  return reqs[i]
end
response = function(status, headers, body)
  seen = seen + 1
  if status ~= 200 then bad = bad + 1 end
  if seen == 1 then io.open(os.getenv("BENCH_OUT") .. ".start", "w"):close() end
  if seen == #reqs then
    local f = io.open(os.getenv("BENCH_OUT") .. ".done", "w")
    f:write(string.format("%d %d\n", seen, bad))
    f:close()
    wrk.thread:stop()
  end
end
EOF
}

# key_pass NAME LUA KEYS URL CONNS: one pass over the keys in KEYS (a file, one a line)
# with CONNS connections; files NAME.start and NAME.done beside it. Sets NAME_n (responses),
# NAME_err (responses not 200), NAME_us (microseconds from the first response to the last)
# and NAME_rps (the responses after the first over that time). Exits if the pass does not
# finish within 300 s.
key_pass() {
  local name="$1" lua="$2" keys="$3" url="$4" conns="$5"
  local out="$WORK/$name" wrk_pid n bad us _
  rm -f "$out.start" "$out.done"
  BENCH_KEYS="$keys" BENCH_OUT="$out" taskset -c 1 wrk -t1 -c"$conns" -d300s -s "$lua" "$url" \
    >/dev/null 2>&1 &
  wrk_pid=$!
  for _ in $(seq 3000); do [ -e "$out.done" ] && break; kill -0 "$wrk_pid" 2>/dev/null || break; sleep 0.1; done
  kill "$wrk_pid" 2>/dev/null || true; wait "$wrk_pid" 2>/dev/null || true
  [ -e "$out.done" ] || { echo "key_pass: the $name pass did not finish" >&2; exit 1; }
  read -r n bad <"$out.done"
  us="$(python3 -c 'import os,sys; s,d=sys.argv[1:]; print((os.stat(d).st_mtime_ns-os.stat(s).st_mtime_ns)//1000)' "$out.start" "$out.done")"
  printf -v "${name}_n" %s "$n"
  printf -v "${name}_err" %s "$bad"
  printf -v "${name}_us" %s "$us"
  printf -v "${name}_rps" %s "$(python3 -c 'import sys; n,us=map(int,sys.argv[1:]); print(round((n-1)/us*1e6) if us else 0)' "$n" "$us")"
}

# proc_ticks PID...: the CPU time (user + system, clock ticks) of these processes so far,
# their threads included; a process that is gone counts nothing.
proc_ticks() {
  local p
  for p in "$@"; do cat "/proc/$p/stat" 2>/dev/null || true; done |
    awk '{sub(/^.*\) /, ""); s += $12 + $13} END {print s + 0}'
}

# postgres_ticks: proc_ticks of every PostgreSQL process on this machine (0 if none is
# visible, e.g. the server runs elsewhere).
postgres_ticks() {
  # shellcheck disable=SC2046
  proc_ticks $(pgrep -x postgres || true)
}
