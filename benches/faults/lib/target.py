#!/usr/bin/env python3
"""A small keep-alive HTTP/1.1 target for the fault suite, on 127.0.0.1:PORT.

Every request gets `200 ok`; a path starting with /slow gets the head at once
and its body BODY_DELAY seconds later (a response still in flight when the
gateway is told to stop). Prints `listening` once bound.

usage: target.py PORT [BODY_DELAY]
"""
import asyncio
import sys

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n"


async def serve(reader, writer, delay):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            slow = head.split(b" ", 2)[1].startswith(b"/slow")
            writer.write(HEAD)
            if slow:
                await writer.drain()
                await asyncio.sleep(delay)
            writer.write(b"ok")
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, IndexError):
        pass
    finally:
        writer.close()


async def main():
    port = int(sys.argv[1])
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    server = await asyncio.start_server(
        lambda r, w: serve(r, w, delay), "127.0.0.1", port, reuse_address=True, backlog=1024
    )
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
