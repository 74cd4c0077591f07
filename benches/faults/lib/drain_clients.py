#!/usr/bin/env python3
"""Keep-alive clients through a drain: N_SLOW connections loop on GET /slow
(the target sends the head at once and the body a second later), N_FAST on
GET /fast; each sends its next request as soon as a response without
`Connection: close` is whole. Once every connection has had a response, the
gateway (GW_PID) gets SIGTERM half-way through a slow body. Prints one JSON
object: how each connection ended, the responses completed after the signal
and how many of them said `Connection: close`, and how long the gateway took
to exit after the signal. Bounded: every read times out.

usage: drain_clients.py HOST PORT GW_PID N_SLOW N_FAST
"""
import asyncio
import json
import os
import signal
import sys
import time


async def client(host, port, path, state, ready):
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
    except (OSError, asyncio.TimeoutError):
        return "connect failed"
    first = True
    try:
        while True:
            w.write(request)
            await w.drain()
            try:
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
            except asyncio.IncompleteReadError as e:
                return "next request met EOF" if not e.partial else "cut mid-response"
            length = 0
            close = False
            for line in head.lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
                if line.startswith(b"connection:") and b"close" in line:
                    close = True
            await asyncio.wait_for(r.readexactly(length), 10)
            if state["signalled"] is not None:
                state["after"] += 1
                state["after_close"] += close
            if first:
                first = False
                ready.release()
            if close:
                return "ended on Connection: close"
    except ConnectionResetError:
        return "next request met RST"
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
        return f"error: {type(e).__name__}"
    finally:
        w.close()


def exited(pid):
    """Whether process `pid` has ended (gone, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def main():
    host, port, pid, n_slow, n_fast = sys.argv[1:6]
    port, pid, n_slow, n_fast = int(port), int(pid), int(n_slow), int(n_fast)
    state = {"signalled": None, "after": 0, "after_close": 0}
    ready = asyncio.Semaphore(0)
    tasks = [
        asyncio.create_task(client(host, port, "/slow", state, ready)) for _ in range(n_slow)
    ] + [asyncio.create_task(client(host, port, "/fast", state, ready)) for _ in range(n_fast)]
    for _ in range(n_slow + n_fast):
        await asyncio.wait_for(ready.acquire(), 15)
    # Every slow connection has just sent its second request: its head is
    # out, its body comes in a second.
    await asyncio.sleep(0.5)
    state["signalled"] = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    ends = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    while not exited(pid) and time.monotonic() - state["signalled"] < 60:
        await asyncio.sleep(0.01)
    drain_ms = round((time.monotonic() - state["signalled"]) * 1000)
    slow, fast = ends[:n_slow], ends[n_slow:]
    count = lambda xs: {k: xs.count(k) for k in sorted(set(xs))}
    print(
        json.dumps(
            {
                "slow_connections": count(slow),
                "fast_connections": count(fast),
                "responses_after_signal": state["after"],
                "of_which_with_connection_close": state["after_close"],
                "exit_ms_after_signal": drain_ms,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
