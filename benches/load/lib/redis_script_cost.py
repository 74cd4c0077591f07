#!/usr/bin/env python3
"""Sends the rate limiter's script calls to a Redis, built as the gateway builds them
(src/ratelimit/redis/script.rs, `script_cmd`): each distinct key once, the distinct
(interval, burst) pairs as little-endian doubles, then the requests in runs of alike ones,
each run its length (a big-endian u16, top bit set: paired) and four bytes per decision
(key index, pair * 8 + op, each a big-endian u16). Every request is two decisions: the
auth-failure guard's peek of its client's key, then, only if allowed, a check of its API
key's bucket. With CREDITS 1, each request's key also has usage credits (more than the
run spends), spent in the same call: each run's header has bit 14 set and is followed by
its count's key index and the index of its eight numbers in ARGV[3] (generation, creation,
refill interval and amount, cached period and count, cost, the count's TTL in ms).

    redis_script_cost.py PORT SCRIPT_FILE CALLS REQUESTS_PER_CALL CLIENTS [CREDITS]

CLIENTS distinct clients (and API keys) take turns, so 1 is one hot key of each kind and
a large number a key of its own for every request of a call. One call at a time; checks
every reply's length.
"""
import socket
import struct
import sys

port, script_file, calls, per_call, clients = sys.argv[1:6]
port, calls, per_call, clients = int(port), int(calls), int(per_call), int(clients)
credits = len(sys.argv) > 6 and sys.argv[6] == "1"
script = open(script_file).read()


def encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


sock = socket.create_connection(("127.0.0.1", port))
replies = sock.makefile("rb")


def read():
    line = replies.readline()
    kind = line[:1]
    if kind == b"-":
        sys.exit(f"redis_script_cost.py: Redis answered {line.decode().strip()}")
    if kind in (b"+", b":"):
        return line[1:].strip()
    if kind == b"$":
        n = int(line[1:])
        return None if n < 0 else replies.read(n + 2)[:-2]
    if kind == b"*":
        return [read() for _ in range(int(line[1:]))]
    sys.exit(f"redis_script_cost.py: unexpected reply {line!r}")


def command(*args):
    sock.sendall(encode(args))
    return read()


sha = command("SCRIPT", "LOAD", script)
GUARD = (1_000_000_000, 100_000_000_000_000)  # pair 0: peek (op 1)
POLICY = (1_000, 1_000_000_000_000_000)  # pair 1: check (op 0), if the peek allowed
PARAMS = struct.pack("<4d", *GUARD, *POLICY)
# One key's credits: generation 1, no refill (so its creation time is not read), 10^12
# left, cost 1, a day's TTL.
CREDIT_PARAMS = struct.pack("<8d", 1, 0, 0, 0, 0, 1e12, 1, 86_400_000) if credits else b""
for i in range(calls):
    # Consecutive requests of one client: (client, run length).
    runs = []
    for r in range(per_call):
        client = (i * per_call + r) % clients
        if runs and runs[-1][0] == client:
            runs[-1][1] += 1
        else:
            runs.append([client, 1])
    keys, ops = [], b""
    for client, n in runs:
        ops += (0x8000 | (0x4000 if credits else 0) | n).to_bytes(2, "big")
        for key, code in ((b"bench:rl:9:ip%d" % client, 0 * 8 + 1), (b"bench:rl:0:k%d" % client, 1 * 8 + 0)):
            if key not in keys:
                keys.append(key)
            ops += keys.index(key).to_bytes(2, "big") + code.to_bytes(2, "big")
        if credits:
            count = b"bench:cr:k%d" % client
            if count not in keys:
                keys.append(count)
            ops += keys.index(count).to_bytes(2, "big") + (0).to_bytes(2, "big")
    reply = command("EVALSHA", sha, len(keys), *keys, PARAMS, ops, CREDIT_PARAMS)
    if len(reply) != 8 * (2 + (3 if credits else 2) * len(runs)):
        sys.exit(f"redis_script_cost.py: a reply of {len(reply)} bytes for {per_call} requests")
