"""What a new connection costs the server: connect, one request, close; side by side.

Under heavy overload a client that gives up on a request can only close its connection
(HTTP/1.1 has no way to cancel one request), so it dials again for the next: the server then
pays for connections as well as for requests, and a connection costs it more than a request.
If that cost is high, an overloaded server that falls behind feeds on itself: late answers
make clients leave, leaving makes connections, connections take the CPU the answers needed.

Each contender (as in ``bench/server/request_path.py``: ``batchserve serve`` on the null model and
``bench/apps/yardstick.py``, each in its own process on a free port of 127.0.0.1) is sent
``--connections`` connections, ``--concurrency`` at a time, each carrying one OpenAI
``POST /v1/embeddings`` and closed by the client once the answer has come (as a client that
gives up closes it); ``--refuse`` sends requests whose ``X-Request-Deadline`` has already
passed, the requests an overloaded server finds in its socket buffers (answered 504 from
their head by batchserve; the yardstick has no deadlines and serves them). The server's CPU
(``/proc``, user and system, the kernel's share of the connection included) is read before
and after; the table gives each one's median CPU per connection over the rounds and the
ratio, and the same for requests on kept-alive connections for scale.

Run: ``python bench/server/connection_cpu.py [--rounds 3] [--connections 4000]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from batchserve_testing.bench import cpu_s, running

BODY = b'{"input": "hello world", "model": "m"}'


def request(deadline: bool) -> bytes:
    extra = b"X-Request-Deadline: %.3f\r\n" % (time.time() - 1) if deadline else b""
    return (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"%sContent-Length: %d\r\n\r\n%s" % (extra, len(BODY), BODY)
    )


async def _one(port: int, data: bytes, requests: int) -> int:
    """One connection: ``requests`` requests one after the other, then close. Returns 2xx."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    ok = 0
    try:
        for _ in range(requests):
            writer.write(data)
            head = await reader.readuntil(b"\r\n\r\n")
            ok += head.startswith(b"HTTP/1.1 2")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
    finally:
        writer.close()
    return ok


async def _drive(port: int, connections: int, concurrency: int, per: int, data: bytes) -> int:
    left = connections
    ok = 0

    async def worker() -> None:
        nonlocal left, ok
        while left > 0:
            left -= 1
            got = await _one(port, data, per)  # not ``ok += await``: that reads ``ok`` first
            ok += got

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok


def measure(port: int, pid: int, connections: int, concurrency: int, per: int, dead: bool) -> float:
    """Server CPU microseconds per connection (``per`` requests on each)."""
    data = request(dead)
    asyncio.run(_drive(port, 200, concurrency, per, data))  # warm up
    time.sleep(0.3)
    cpu0 = cpu_s(pid)
    ok = asyncio.run(_drive(port, connections, concurrency, per, data))
    time.sleep(0.3)  # closes and timers settle
    if not dead and ok != connections * per:
        raise RuntimeError(f"{connections * per - ok} of {connections * per} requests failed")
    return 1e6 * (cpu_s(pid) - cpu0) / connections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--refuse", action="store_true", help="requests already past deadline")
    args = parser.parse_args()
    names = ["yardstick", "batchserve"]
    conn: dict[str, list[float]] = {n: [] for n in names}
    kept: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            with running(name) as (port, pid):
                c = measure(port, pid, args.connections, args.concurrency, 1, args.refuse)
                k = measure(port, pid, args.connections // 20, args.concurrency, 20, args.refuse)
                conn[name].append(c)
                kept[name].append(k / 20)
                print(
                    f"round {r + 1} {name}: {c:.0f} us per connection, {k / 20:.0f} us per "
                    "kept-alive request",
                    file=sys.stderr,
                    flush=True,
                )
    what = "requests already past their deadline" if args.refuse else "requests"
    print(f"\nServer CPU (user + system), median of {args.rounds} rounds, {what}:\n")
    print("| server | per connection (1 request) | per request, kept alive | ratio |")
    print("|---|---:|---:|---:|")
    base = statistics.median(conn["yardstick"])
    for name in names:
        c, k = statistics.median(conn[name]), statistics.median(kept[name])
        print(f"| {name} | {c:.0f} us | {k:.0f} us | {c / base:.2f}x |")


if __name__ == "__main__":
    main()
