"""Scenario 7, by hand: hostile and malformed requests, in raw bytes, to a real server.

Each case is sent on its own connection to one server (an embedding model and a generic
model, a 1 s read timeout). Each must get its 4xx, with its reason and a message that names
what was wrong, and leave the server healthy: after each, a normal request is answered 200.
At the end the server's counters add up and no request was answered 5xx. Timing tolerance:
the read timeout is 1 s; an answer to a stalled client must come within 1 s plus 1 s (and
not more than 50 ms before 1 s by the client's clock, which starts after the server's).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from batchserve_testing.harness import FAULTY, Server, serve
from batchserve_testing.rawhttp import read_response
from batchserve_testing.scenarios import http_request

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

READ_TIMEOUT_S = 1.0
SLACK_S = 1.0
EARLY_S = 0.05  # the server's clock starts when it accepts, a little before ours
E = "/v1/embeddings"
K = "/v2/models/faulty/infer"
G = "/v2/models/gen/infer"


def post(path: str, body: bytes, ctype: str | None = "application/json", extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    if ctype is not None:
        head += f"Content-Type: {ctype}\r\n"
    return (head + extra + "\r\n").encode() + body


def kserve_body(**fields: object) -> bytes:
    text = {"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x"]}
    return json.dumps({"inputs": [text], **fields}).encode()


def exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        return read_response(s)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    env = {"BATCHSERVE_FAULT_COST": "fixed=0ms,per_item=0ms,dim=4"}
    args = [
        "--model",
        FAULTY,
        "--model",
        "gen=synthetic:fixed=0ms,per_item=0ms,dim=0",
        "--max-wait",
        "0ms",
        "--read-timeout",
        f"{READ_TIMEOUT_S}s",
    ]
    with serve(args, env) as s:
        yield s
        counts = s.settled_counts()
        assert counts.by_reason.get("internal", 0) == 0, counts.by_reason


def still_serves(server: Server) -> None:
    assert server.healthy()
    status, _, body = exchange(server.port, http_request("still fine"))
    assert status == 200, body


DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE_INT = b"1" + b"0" * 400

CASES: dict[str, tuple[bytes, int, str | None, str]] = {
    # Not JSON, or not readable as JSON.
    "invalid JSON": (post(E, b'{"input": }'), 400, "malformed", "valid JSON"),
    "empty body": (post(E, b""), 400, "malformed", "valid JSON"),
    "invalid UTF-8": (post(E, b'{"input": "\xff\xfe"}'), 400, "malformed", "utf-8"),
    "raw NUL byte": (post(E, b'{"input": "a\x00b"}'), 400, "malformed", "control character"),
    "deeply nested JSON": (post(E, DEEP), 400, "malformed", "nested too deeply"),
    "deeply nested tensor data": (
        post(G, b'{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","data":' + DEEP + b"}]}"),
        400,
        "malformed",
        "nested too deeply",
    ),
    # Wrong content types and encodings.
    "text/plain": (
        post(E, b'{"input": "x"}', "text/plain"),
        415,
        "unsupported_media_type",
        "Content-Type",
    ),
    "XML": (
        post(E, b"<input>x</input>", "application/xml"),
        415,
        "unsupported_media_type",
        "application/xml",
    ),
    "a form": (
        post(E, b"input=x", "application/x-www-form-urlencoded"),
        415,
        "unsupported_media_type",
        "Content-Type must be application/json",
    ),
    "multipart": (
        post(E, b"--b\r\n\r\nx\r\n--b--", "multipart/form-data; boundary=b"),
        415,
        "unsupported_media_type",
        "multipart/form-data",
    ),
    "KServe as text/plain": (
        post(K, kserve_body(), "text/plain"),
        415,
        "unsupported_media_type",
        "application/octet-stream",
    ),
    "gzip body": (
        post(E, b"\x1f\x8b\x08\x00", extra="Content-Encoding: gzip\r\n"),
        415,
        "unsupported_media_type",
        "Content-Encoding must be identity",
    ),
    # Huge numbers.
    "dimensions 1e999": (
        post(E, b'{"input": "x", "dimensions": 1e999}'),
        422,
        "invalid",
        "dimensions must be an integer",
    ),
    "a 5000-digit integer": (
        post(E, b'{"input": "x", "dimensions": ' + b"9" * 5000 + b"}"),
        400,
        "malformed",
        "digits",
    ),
    "KServe timeout 1e400 us": (
        post(
            K,
            b'{"inputs":[{"name":"t","shape":[1],"datatype":"BYTES","data":["x"]}],"parameters":{"timeout":'
            + HUGE_INT
            + b"}}",
        ),
        422,
        "invalid",
        "parameters.timeout must be finite",
    ),
    "X-Request-Timeout 1e400": (
        post(E, b'{"input": "x"}', extra="X-Request-Timeout: 1e400\r\n"),
        422,
        "invalid",
        "X-Request-Timeout must be finite",
    ),
    "INT64 beyond range": (
        post(
            G,
            b'{"inputs":[{"name":"a","shape":[1],"datatype":"INT64","data":[' + b"9" * 40 + b"]}]}",
        ),
        422,
        "invalid",
        "data is not INT64",
    ),
    # Too much.
    "a body over the limit": (
        post(E, b'{"input": "' + b"a" * (9 << 20) + b'"}'),
        413,
        "too_large",
        "at most 8388608 bytes",
    ),
    "a Content-Length of a terabyte": (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n{}",
        413,
        "too_large",
        "Content-Length is 1000000000000",
    ),
    "a million tiny inputs": (
        post(E, json.dumps({"input": ["a"] * 1_000_000}).encode()),
        413,
        "too_large",
        "at most 2048 items",
    ),
    "a very long string": (
        # The whole text asked for (split, not truncated): over --max-input-chars is refused.
        post(E, json.dumps({"input": "a" * 1_000_000, "long_inputs": {"split": True}}).encode()),
        413,
        "too_large",
        "at most 32768 characters",
    ),
    "a hundred thousand tensors": (
        post(
            K,
            json.dumps(
                {
                    "inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x"]}]
                    * 100_000
                }
            ).encode(),
        ),
        413,
        "too_large",
        "at most 256 tensors",
    ),
    "a billion empty rows": (
        post(G, b'{"inputs":[{"name":"a","shape":[1000000000,0],"datatype":"FP32","data":[]}]}'),
        413,
        "too_large",
        "at most 2048 rows",
    ),
    "forty axes": (
        post(
            G,
            json.dumps(
                {"inputs": [{"name": "a", "shape": [1] * 40, "datatype": "FP32", "data": [1]}]}
            ).encode(),
        ),
        422,
        "invalid",
        "at most 32 axes",
    ),
    "a 100 KB header": (
        post(E, b'{"input": "x"}', extra="X-Junk: " + "a" * 100_000 + "\r\n"),
        431,
        "head_too_large",
        "at most 65536 bytes",
    ),
    # Text that is not text.
    "a lone surrogate": (post(E, b'{"input": "\\ud800"}'), 422, "invalid", "lone surrogate"),
    "a lone surrogate in a tensor": (
        post(
            K, b'{"inputs":[{"name":"\\ud800","shape":[1],"datatype":"BYTES","data":["\\udc00"]}]}'
        ),
        422,
        "invalid",
        "lone surrogate",
    ),
    # Wrong shapes of the KServe body.
    "tensor parameters not an object": (
        post(
            K,
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "t",
                            "shape": [1],
                            "datatype": "BYTES",
                            "data": ["x"],
                            "parameters": [1],
                        }
                    ]
                }
            ).encode(),
        ),
        422,
        "invalid",
        "inputs[0].parameters must be an object",
    ),
    "output parameters not an object": (
        post(K, kserve_body(outputs=[{"name": "embedding", "parameters": "yes"}])),
        422,
        "invalid",
        "outputs[0].parameters must be an object",
    ),
    # HTTP itself.
    "garbage request line": (b"\x00\x01\x02 / HTTP/1.1\r\n\r\n", 400, None, "Invalid HTTP request"),
    "NUL in a header": (
        post(E, b'{"input": "x"}', extra="X-Junk: a\x00b\r\n"),
        400,
        None,
        "Invalid HTTP request",
    ),
    "wrong method": (
        b"DELETE /v1/embeddings HTTP/1.1\r\nHost: x\r\n\r\n",
        405,
        "method_not_allowed",
        "takes POST",
    ),
    "unknown path": (b"GET /v3/nothing HTTP/1.1\r\nHost: x\r\n\r\n", 404, "not_found", "no route"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_request_gets_its_4xx_and_the_server_stays_healthy(
    server: Server, case: str
) -> None:
    data, status, reason, words = CASES[case]
    got, headers, body = exchange(server.port, data)
    assert got == status, body[:300]
    assert headers.get("x-reason") == reason, headers
    assert words in body.decode("utf-8", "replace"), body[:300]
    if status == 405:
        assert headers["allow"] == "POST"
    still_serves(server)


def test_a_nul_inside_a_json_string_is_text_like_any_other(server: Server) -> None:
    status, _, body = exchange(server.port, post(E, b'{"input": "a\\u0000b"}'))
    assert status == 200, body


def test_a_body_that_stalls_half_way_gets_408_at_the_read_timeout(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(post(E, b'{"input": "' + b"a" * 50 + b'"}')[:-20])  # 20 bytes never come
        status, headers, body = read_response(s)
        took = time.monotonic() - t0
        assert (status, headers["x-reason"]) == (408, "request_timeout"), body
        assert b"--read-timeout" in body
        assert headers["connection"] == "close"
        assert s.recv(1) == b""  # and the connection is closed
    assert READ_TIMEOUT_S - EARLY_S <= took < READ_TIMEOUT_S + SLACK_S
    still_serves(server)


def test_a_body_sent_a_byte_at_a_time_gets_408_at_the_read_timeout(server: Server) -> None:
    data = post(E, b'{"input": "' + b"a" * 200 + b'"}')
    head, _, body = data.partition(b"\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(head + b"\r\n\r\n")
        got = b""
        s.setblocking(False)
        for byte in body:  # slow loris: a byte every 50 ms, 10 s in all
            try:
                s.send(bytes([byte]))
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
            try:
                got += s.recv(65536)
            except BlockingIOError:
                continue
            if got:
                break
        took = time.monotonic() - t0
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert READ_TIMEOUT_S - EARLY_S <= took < READ_TIMEOUT_S + SLACK_S
    still_serves(server)


def test_a_head_that_stalls_gets_408_and_an_idle_connection_is_closed(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Le")
        status, headers, body = read_response(s)
        took = time.monotonic() - t0
    assert (status, headers["x-reason"]) == (408, "request_timeout"), body
    assert b"head must arrive within 1s" in body
    assert READ_TIMEOUT_S - EARLY_S <= took < READ_TIMEOUT_S + SLACK_S
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        t0 = time.monotonic()
        assert s.recv(1) == b""  # opened, never used: closed, without a word
        took = time.monotonic() - t0
    assert READ_TIMEOUT_S - EARLY_S <= took < READ_TIMEOUT_S + SLACK_S
    still_serves(server)


def test_a_client_that_leaves_half_way_through_its_body_is_counted_cancelled(
    server: Server,
) -> None:
    before = server.counts()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(post(E, b'{"input": "' + b"a" * 50 + b'"}')[:-20])
        time.sleep(0.1)
    counts = server.settled_counts()
    assert counts["cancelled"] == before["cancelled"] + 1
    assert counts.received == before.received + 1
    still_serves(server)
