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

``--refusals`` measures what a REFUSED call costs the server instead, three contenders:

* ``echo``: the floor, as above (every call answered);
* ``expired``: batchserve, every call carrying an ``x-request-deadline`` already past, as a
  call that waited inside grpcio past its deadline reaches the handler: refused
  ``DEADLINE_EXCEEDED`` by batchserve's own handler (``App.begin``), never decoded;
* ``grpcio-limit``: batchserve with ``--grpc-max-calls 1`` and one call held in flight (a
  model pass of 20 s): every other call is refused ``RESOURCE_EXHAUSTED`` by grpcio before
  any handler of batchserve's runs.

``--baseline-src DIR`` adds ``expired (baseline)``: the same as ``expired`` with the server
imported from ``DIR`` (a ``src`` folder of another checkout, e.g. from ``git archive``), to
compare two versions of the refusal path side by side in the same rounds.

Run: ``python bench/server/grpc_cpu.py [--rates 500,1500] [--seconds 5] [--rounds 3]
[--stream | --refusals [--baseline-src DIR]]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from batchserve_testing.bench import batchserve, process_cpu_s

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


async def drive(
    address: str,
    pid: int,
    rate: float,
    seconds: float,
    metadata: tuple[tuple[str, str], ...] = (),
    hold: bool = False,
) -> tuple[int, int, float]:
    """Calls answered, calls failed, and the server's CPU seconds over the window.

    ``metadata`` goes with every call; ``hold``: one call is started first and kept in
    flight over the window (cancelled after it).
    """
    import grpc
    import grpc.aio

    body = request_body()
    async with grpc.aio.insecure_channel(address) as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
        held = None
        if hold:
            held = call(body, timeout=60)
            await asyncio.sleep(0.5)
        for _ in range(200):  # warm: the connection, the server's first passes
            with contextlib.suppress(grpc.aio.AioRpcError):
                await call(body, timeout=5, metadata=metadata)
        ok = failed = 0
        codes: dict[str, int] = {}

        async def one() -> None:
            nonlocal ok, failed
            try:
                await call(body, timeout=5, metadata=metadata)
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
        if held is not None:
            held.cancel()
        if codes:
            print(f"# {address}: failed calls by status: {codes}", file=sys.stderr)
        return ok, failed, cpu


#: A deadline long past, as a call that waited inside grpcio past its own reaches us.
PAST = (("x-request-deadline", "1.0"),)


async def drive_expired(
    address: str, pid: int, rate: float, seconds: float
) -> tuple[int, int, float]:
    """As :func:`drive`, every call's deadline already past."""
    return await drive(address, pid, rate, seconds, metadata=PAST)


async def drive_held(address: str, pid: int, rate: float, seconds: float) -> tuple[int, int, float]:
    """As :func:`drive`, with one call held in flight first."""
    return await drive(address, pid, rate, seconds, hold=True)


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


def run_batchserve(
    rate: float,
    seconds: float,
    driver: Driver,
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[int, int, float]:
    flags = flags or ("--model", f"m={NULL}", "--max-batch-size", "64")
    flags = (*flags, "--grpc-port", "0")
    with batchserve(list(flags), env=env) as served:
        assert served.grpc is not None
        with asyncio.Runner(loop_factory=new_loop) as runner:
            return runner.run(driver(served.grpc, served.proc.pid, rate, seconds))


#: A model whose one pass lasts 20 s: the held call stays in flight over the window.
HELD = (
    "--model", "m=synthetic:fixed=20s,per_item=0ms,dim=8", "--timeout", "60s",
    "--drain-timeout", "1s",
)  # fmt: skip


def refusals(args: argparse.Namespace, rates: list[float]) -> None:
    """The ``--refusals`` table: server CPU per refused call, and the echo floor."""
    contenders: dict[str, Callable[[float, float], tuple[int, int, float]]] = {
        "echo": lambda r, s: run_echo(r, s, drive),
        "expired": lambda r, s: run_batchserve(r, s, drive_expired),
        "grpcio-limit": lambda r, s: run_batchserve(
            r, s, drive_held, (*HELD, "--grpc-max-calls", "1")
        ),
    }
    if args.baseline_src:
        env = {"PYTHONPATH": os.pathsep.join([args.baseline_src, os.environ.get("PYTHONPATH", "")])}
        contenders["expired (baseline)"] = lambda r, s: run_batchserve(r, s, drive_expired, env=env)
    print(f"# server CPU per call, {args.seconds:g} s windows, {os.cpu_count()} CPUs")
    print("| rate (calls/s) | contender | answered | refused | server CPU per call (us) | ratio |")
    print("|---|---|---|---|---|---|")
    for rate in rates:
        per: dict[str, list[float]] = {n: [] for n in contenders}
        counts: dict[str, list[tuple[int, int]]] = {n: [] for n in contenders}
        names = list(contenders)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                ok, failed, cpu = contenders[name](rate, args.seconds)
                per[name].append(cpu / max(1, ok + failed) * 1e6)
                counts[name].append((ok, failed))
                time.sleep(0.5)
        floor = statistics.median(per["echo"])
        for name in names:
            cpu_us = statistics.median(per[name])
            answered = statistics.median(c[0] for c in counts[name])
            refused = statistics.median(c[1] for c in counts[name])
            print(
                f"| {rate:g} | {name} | {answered:g} | {refused:g} | {cpu_us:.0f} | "
                f"{cpu_us / floor:.2f}x |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="500,1500", help="calls per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each window")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median reported)")
    parser.add_argument("--stream", action="store_true", help="one ModelStreamInfer stream")
    parser.add_argument("--refusals", action="store_true", help="CPU per refused call")
    parser.add_argument("--baseline-src", help="with --refusals: a src folder to compare")
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    driver: Driver = drive_stream if args.stream else drive
    if args.echo_server:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(echo_server())
        return
    rates = [float(r) for r in args.rates.split(",")]
    if args.refusals:
        refusals(args, rates)
        return
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
