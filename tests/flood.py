"""The attack on an ingress, as a process of its own (an attacker is not the test that judges):
``python flood.py PORT SECONDS IDLE`` floods 127.0.0.1:PORT for SECONDS with 60 KB URLs,
malformed requests and IDLE connections that never send a byte (closed all at once and opened
again every few seconds), then prints what it sent as JSON.

The idle connections come from 127.0.0.1, the long URLs from 127.0.0.4 and the malformed
requests from 127.0.0.5: from one address, the idle ones hold that address's share of
connections and the rest is refused at the door before the ingress reads a byte of it (on a
busy machine, all of it), so what the ingress makes of a long URL would go untried."""

from __future__ import annotations

import contextlib
import json
import random
import resource
import socket
import sys

import trio

LONG_PATH = b"/app/" + b"a/" * 30_000  # 60 KB


async def long_urls(port: int, sent: dict[str, int]) -> None:
    while True:
        with contextlib.suppress(OSError, trio.BrokenResourceError), trio.move_on_after(2):
            stream = await trio.open_tcp_stream("127.0.0.1", port, local_address="127.0.0.4")
            async with stream:
                await stream.send_all(b"GET " + LONG_PATH + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                while await stream.receive_some(65536):
                    pass
        sent["long"] += 1
        await trio.lowlevel.checkpoint()


def shapes(rng: random.Random) -> list[bytes]:
    return [
        rng.randbytes(rng.randrange(1, 300)),
        b"GET /app HTTP/1.1\r\nHost: x\r\nCookie: theme=dark;\r\n\r\n",
        b"GET /app HTTP/1.1\r\nHost: x\r\nX: "
        + rng.randbytes(40).replace(b"\n", b"")
        + b"\r\n\r\n",
        b"POST /app HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
        b"\r\n\r\n0\r\n\r\n",
        b"GET /app/../admin HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /app HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
        b"POST /app HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc",
        b"GET /app HTTP/9.9\r\n\r\n",
        b"GET /app HTTP/1.1\r\nHost: x\r\n" + b"A: b\r\n" * 5000 + b"\r\n",
    ]


async def malformed(port: int, seed: int, sent: dict[str, int]) -> None:
    rng = random.Random(seed)
    while True:
        with contextlib.suppress(OSError, trio.BrokenResourceError), trio.move_on_after(2):
            stream = await trio.open_tcp_stream("127.0.0.1", port, local_address="127.0.0.5")
            async with stream:
                await stream.send_all(rng.choice(shapes(rng)))
                while await stream.receive_some(65536):
                    pass
        sent["malformed"] += 1
        await trio.lowlevel.checkpoint()


async def idle(port: int, count: int, sent: dict[str, int]) -> None:
    held: list[socket.socket] = []
    try:
        while True:
            for _ in range(count):
                sock = socket.socket()
                held.append(sock)
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    sock.connect(("127.0.0.1", port))
                sent["idle"] += 1
                if len(held) % 200 == 0:
                    await trio.lowlevel.checkpoint()
            sent["held"] = len(held)
            await trio.sleep(5)
            for sock in held:
                sock.close()
            held.clear()
    finally:
        for sock in held:
            sock.close()


async def main(port: int, seconds: float, count: int) -> None:
    sent = {"long": 0, "malformed": 0, "idle": 0, "held": 0}
    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(idle, port, count, sent)
            for _ in range(3):
                nursery.start_soon(long_urls, port, sent)
            for seed in range(3):
                nursery.start_soon(malformed, port, seed, sent)
    print(json.dumps(sent), flush=True)


if __name__ == "__main__":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    trio.run(main, int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
