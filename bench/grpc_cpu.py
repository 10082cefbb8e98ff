"""Server CPU per gRPC call, null model: batchserve's ModelInfer vs a bare grpcio echo server.

The contenders, each a fresh process on 127.0.0.1, one after the other in every round:

* ``batchserve``: ``batchserve serve --model m=<null model> --grpc-port 0`` (max batch 64,
  max wait 2 ms), answering ``ModelInfer`` through its whole request path;
* ``echo``: the floor of the library, a grpcio asyncio server with one generic handler (no
  protos) that returns the request's bytes, on the same event loop batchserve runs on
  (uvloop when installed).

The client (this process, grpcio's asyncio channel, one HTTP/2 connection as tritonclient
opens) sends the same serialized ``ModelInferRequest`` (one BYTES text in
``raw_input_contents``, as tritonclient sends it) open loop: send times come from the rate,
never from answers. The server's CPU (user + system, from ``/proc``) is read before the
first call and after the last answer; the table gives each contender's median CPU per call
over the rounds, the calls answered, and the ratio batchserve / echo at each rate.

``--stream`` sends the same requests as messages of one ``ModelStreamInfer`` stream instead
(the echo server then echoes each message of a stream): the cost per request of the
streaming call.

Run: ``.venv/bin/python bench/grpc_cpu.py [--rates 500,1500] [--seconds 5] [--rounds 3]
[--stream]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from _harness import batchserve, process_cpu_s

NULL = "synthetic:fixed=0ms,per_item=0ms,dim=8"
METHOD = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def request_body() -> bytes:
    """The call every contender gets: one text, as tritonclient.grpc serializes it."""
    from batchserve.server.protocols.proto import grpc_service_pb2 as pb
    from batchserve.server.protocols.tensors import pack_bytes

    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(pack_bytes([b"hello world"]))
    return request.SerializeToString()


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (as batchserve serve runs), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def echo_server() -> None:
    """The floor: a generic handler that answers every call with its request's bytes."""
    import grpc
    import grpc.aio

    async def echo(request: bytes, context: Any) -> bytes:
        return request

    async def echo_stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(echo),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(echo_stream),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"ready 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


async def drive(address: str, pid: int, rate: float, seconds: float) -> tuple[int, int, float]:
    """Calls answered, calls failed, and the server's CPU seconds over the window."""
    import grpc
    import grpc.aio

    body = request_body()
    async with grpc.aio.insecure_channel(address) as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
        for _ in range(200):  # warm: the connection, the server's first passes
            await call(body, timeout=5)
        ok = failed = 0
        codes: dict[str, int] = {}

        async def one() -> None:
            nonlocal ok, failed
            try:
                await call(body, timeout=5)
                ok += 1
            except grpc.aio.AioRpcError as exc:
                failed += 1
                codes[exc.code().name] = codes.get(exc.code().name, 0) + 1

        loop = asyncio.get_running_loop()
        n = int(rate * seconds)
        cpu0 = process_cpu_s(pid)
        start = loop.time() + 0.01
        tasks = []
        for i in range(n):
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)
        cpu = process_cpu_s(pid) - cpu0
        if codes:
            print(f"# {address}: failed calls by status: {codes}", file=sys.stderr)
        return ok, failed, cpu


async def drive_stream(
    address: str, pid: int, rate: float, seconds: float
) -> tuple[int, int, float]:
    """As :func:`drive`, the requests sent as the messages of one stream."""
    import grpc
    import grpc.aio

    body = request_body()
    async with grpc.aio.insecure_channel(address) as channel:
        method: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(STREAM)
        stream = method()
        for _ in range(200):
            await stream.write(body)
            await stream.read()
        loop = asyncio.get_running_loop()
        n = int(rate * seconds)
        ok = failed = 0

        async def read() -> None:
            nonlocal ok, failed
            for _ in range(n):
                answer = await stream.read()
                if answer is grpc.aio.EOF:
                    return
                # batchserve's answer with an error starts with field 1 (error_message); the
                # echo server's is the request itself.
                if answer != body and isinstance(answer, bytes) and answer[:1] == b"\x0a":
                    failed += 1
                else:
                    ok += 1

        cpu0 = process_cpu_s(pid)
        reader = asyncio.ensure_future(read())
        start = loop.time() + 0.01
        for i in range(n):
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await stream.write(body)
        await reader
        cpu = process_cpu_s(pid) - cpu0
        await stream.done_writing()
        return ok, failed, cpu


#: A client: (address, server pid, rate, seconds) -> (answered, failed, server CPU s).
Driver = Callable[[str, int, float, float], Coroutine[Any, Any, tuple[int, int, float]]]


def run_echo(rate: float, seconds: float, driver: Driver) -> tuple[int, int, float]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--echo-server"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().split()[1]
        with asyncio.Runner(loop_factory=new_loop) as runner:
            return runner.run(driver(address, proc.pid, rate, seconds))
    finally:
        proc.terminate()
        proc.wait(10)


def run_batchserve(rate: float, seconds: float, driver: Driver) -> tuple[int, int, float]:
    flags = ["--model", f"m={NULL}", "--grpc-port", "0", "--max-batch-size", "64"]
    with batchserve(flags) as served:
        assert served.grpc is not None
        with asyncio.Runner(loop_factory=new_loop) as runner:
            return runner.run(driver(served.grpc, served.proc.pid, rate, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="500,1500", help="calls per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each window")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median reported)")
    parser.add_argument("--stream", action="store_true", help="one ModelStreamInfer stream")
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    driver: Driver = drive_stream if args.stream else drive
    if args.echo_server:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(echo_server())
        return
    rates = [float(r) for r in args.rates.split(",")]
    print(
        f"# server CPU per {'ModelStreamInfer message' if args.stream else 'ModelInfer call'}, "
        f"null model, {args.seconds:g} s windows, {os.cpu_count()} CPUs"
    )
    print("| rate (calls/s) | contender | answered | failed | server CPU per call (us) | ratio |")
    print("|---|---|---|---|---|---|")
    for rate in rates:
        per: dict[str, list[float]] = {"echo": [], "batchserve": []}
        answered: dict[str, list[int]] = {"echo": [], "batchserve": []}
        failures: dict[str, int] = {"echo": 0, "batchserve": 0}
        for _ in range(args.rounds):
            for name, run in (("echo", run_echo), ("batchserve", run_batchserve)):
                ok, failed, cpu = run(rate, args.seconds, driver)
                per[name].append(cpu / max(1, ok + failed) * 1e6)
                answered[name].append(ok)
                failures[name] += failed
                time.sleep(0.5)
        floor = statistics.median(per["echo"])
        for name in ("echo", "batchserve"):
            cpu_us = statistics.median(per[name])
            print(
                f"| {rate:g} | {name} | {statistics.median(answered[name]):g} | {failures[name]} "
                f"| {cpu_us:.0f} | {cpu_us / floor:.2f}x |"
            )


if __name__ == "__main__":
    main()
