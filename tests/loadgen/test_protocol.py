"""What goes on the wire, and how answers are counted: pure functions, no I/O."""

import json

import pytest

from batchserve.errors import ConfigError
from batchserve.loadgen.config import LoadConfig, Target
from batchserve.loadgen.protocol import (
    CLIENT_TIMEOUT,
    Outcome,
    classify,
    encode_request,
    request_texts,
    split_header_list,
    with_deadline,
)


def _split(raw: bytes) -> tuple[list[str], dict[str, str], dict[str, object]]:
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert int(headers["Content-Length"]) == len(body)
    return lines[0].split(" "), headers, json.loads(body)


def test_openai_request_one_input_and_deadline_header() -> None:
    cfg = LoadConfig(url="http://127.0.0.1:8123", model="m", timeout_s=0.25)
    line, headers, body = _split(encode_request(cfg, ["hello"]))
    assert line == ["POST", "/v1/embeddings", "HTTP/1.1"]
    assert headers["Host"] == "127.0.0.1:8123"
    assert headers["X-Request-Timeout"] == "0.25"
    assert "Authorization" not in headers
    assert body == {"model": "m", "input": "hello", "encoding_format": "float"}


def test_openai_request_several_inputs_is_a_list_and_no_deadline_without_timeout() -> None:
    cfg = LoadConfig(url="http://h/prefix/", model="m", api_key="k")
    line, headers, body = _split(encode_request(cfg, ["a", "b"]))
    assert line[1] == "/prefix/v1/embeddings"
    assert headers["Host"] == "h"
    assert headers["Authorization"] == "Bearer k"
    assert "X-Request-Timeout" not in headers
    assert body["input"] == ["a", "b"]


def test_a_rerank_request_is_one_query_and_its_passages() -> None:
    cfg = LoadConfig(url="http://h", model="ce", api="rerank", timeout_s=1.0)
    passages = ["one two three four five six seven eight nine ten", "b"]
    line, headers, body = _split(encode_request(cfg, passages))
    assert line[1] == "/rerank"
    assert headers["X-Request-Timeout"] == "1"
    assert body == {
        "model": "ce",
        "query": "one two three four five six seven eight",
        "texts": passages,
    }


def test_kserve_request_sends_the_deadline_twice() -> None:
    cfg = LoadConfig(url="http://h:1", api="kserve", model="a b", timeout_s=1.5)
    line, headers, body = _split(encode_request(cfg, ["x", "y", "z"]))
    assert line[1] == "/v2/models/a%20b/infer"
    assert headers["X-Request-Timeout"] == "1.5"
    assert body == {
        "inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": ["x", "y", "z"]}],
        "parameters": {"timeout": 1_500_000},
    }


def test_the_absolute_deadline_is_a_placeholder_filled_in_when_written() -> None:
    cfg = LoadConfig(url="http://h:1", model="m", timeout_s=0.25)
    raw = encode_request(cfg, ["hello"])
    _, headers, _ = _split(raw)
    assert headers["X-Request-Deadline"] == "0000000000.000000"
    _, headers, body = _split(with_deadline(raw, 1767225600.25))
    assert headers["X-Request-Deadline"] == "1767225600.250000"
    assert body["input"] == "hello"  # Content-Length still holds: the width is fixed
    off = LoadConfig(url="http://h:1", model="m", timeout_s=0.25, absolute_deadline=False)
    plain = encode_request(off, ["hello"])
    assert "X-Request-Deadline" not in _split(plain)[1]
    assert with_deadline(plain, 1.0) == plain


def test_outcomes_follow_the_servers_table() -> None:
    assert classify(200) is Outcome.OK
    assert classify(429, "queue_full") is Outcome.REJECTED
    assert classify(503, "draining") is Outcome.REJECTED
    assert classify(504, "deadline_exceeded") is Outcome.TIMED_OUT
    assert classify(0, CLIENT_TIMEOUT) is Outcome.TIMED_OUT
    assert classify(0, "connect: ConnectionRefusedError") is Outcome.ERROR
    assert classify(500, "model_error") is Outcome.ERROR
    assert classify(400) is Outcome.ERROR


def test_texts_cycle_through_the_pool_in_request_order() -> None:
    cfg = LoadConfig(url="http://h", texts=("a", "b", "c"), inputs_per_request=2)
    assert [request_texts(cfg, i) for i in range(4)] == [
        ["a", "b"],
        ["c", "a"],
        ["b", "c"],
        ["a", "b"],
    ]


def test_header_lists() -> None:
    assert split_header_list(b"3, 3,4") == [b"3", b"3", b"4"]
    assert split_header_list(b"7") == [b"7"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "https://h"}, "url must look like http://host:port or grpc://host:port"),
        ({"url": "grpc://h/v2"}, "a grpc:// url must not have a path, got 'grpc://h/v2'"),
        ({"url": "grpc://h"}, "api must be kserve with a grpc:// url, got 'openai'"),
        (
            {"url": "http://h", "api": "grpc"},
            "api must be one of openai, kserve, rerank, got 'grpc'",
        ),
        ({"url": "http://h", "rate": 0}, "rate must be > 0, got 0"),
        ({"url": "http://h", "arrivals": "burst"}, "arrivals must be one of"),
        ({"url": "http://h", "inputs_per_request": 0}, "inputs_per_request must be >= 1"),
        ({"url": "http://h", "timeout_s": -1.0}, "timeout_s must be > 0, got -1.0"),
        ({"url": "http://h", "texts": ()}, "texts must be a non-empty tuple"),
        ({"url": "http://h", "processes": 0}, "processes must be >= 1, got 0"),
    ],
)
def test_config_errors_name_the_field_the_rule_and_the_value(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LoadConfig(**kwargs)  # type: ignore[arg-type]


def test_target_and_give_up_time() -> None:
    assert Target.parse("http://[::1]:9/p") == Target(host="::1", port=9, prefix="/p")
    assert Target.parse("grpc://h") == Target(scheme="grpc", host="h", port=8001, prefix="")
    assert Target.parse("http://[::1]:9/p").host_header == "[::1]:9"
    assert LoadConfig(url="http://h", timeout_s=0.25).give_up_s == 1.25
    assert LoadConfig(url="http://h").give_up_s == 30.0
    assert LoadConfig(url="http://h", timeout_s=0.25, client_timeout_s=0.5).give_up_s == 0.5
    assert "k3y" not in repr(LoadConfig(url="http://h", api_key="k3y"))


def test_a_grpc_request_is_what_the_server_decodes_with_http_s_header_names() -> None:
    from batchserve.loadgen.grpc_client import encode_infer, infer_metadata
    from batchserve.server.protocols.kserve_grpc import parse_model_infer

    cfg = LoadConfig(
        url="grpc://h:1",
        api="kserve",
        model="m",
        timeout_s=0.25,
        priority="2",
        tenant="acme",
        api_key="k",
    )
    msg, request = parse_model_infer(encode_infer(cfg, ["héllo", "b"]))
    assert msg.model_name == "m"
    assert request.inputs[0].name == "text"
    assert request.inputs[0].value == ["héllo".encode(), b"b"]
    assert (request.timeout_s, request.priority) == (0.25, 2)
    assert infer_metadata(cfg) == (
        ("authorization", "Bearer k"),
        ("x-priority", "2"),
        ("x-tenant", "acme"),
        ("x-request-timeout", "0.25"),
        ("x-request-deadline", ""),
    )
    assert infer_metadata(LoadConfig(url="grpc://h", api="kserve")) == ()
