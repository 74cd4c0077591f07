#!/usr/bin/env python3
"""Opens N keep-alive connections to HOST:PORT, sends one authenticated
request on each (so each is an idle keep-alive connection, not a half-open
one), prints `ready OK_COUNT` and holds them until stdin closes or HOLD_SECS
pass. Bounded: every connect and read has a timeout.

usage: hold_conns.py HOST PORT N PATH KEY HOLD_SECS
"""
import asyncio
import sys


async def one(host, port, request, sem):
    async with sem:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
            w.write(request)
            await w.drain()
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await asyncio.wait_for(r.readexactly(length), 10)
            return w if head.startswith(b"HTTP/1.1 200") else None
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            return None


async def main():
    host, port, n, path, key, hold = sys.argv[1:7]
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n\r\n"
    ).encode()
    sem = asyncio.Semaphore(500)  # connect in waves, not 10 000 SYNs at once
    writers = await asyncio.gather(
        *(one(host, int(port), request, sem) for _ in range(int(n)))
    )
    held = [w for w in writers if w is not None]
    print(f"ready {len(held)}", flush=True)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.read), float(hold))
    except asyncio.TimeoutError:
        pass
    for w in held:
        w.close()


if __name__ == "__main__":
    asyncio.run(main())
