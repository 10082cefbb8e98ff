"""The wire side of the load generator: request bytes out, response headers in.

Pure functions, no I/O. The ``rerank`` api sends TEI's ``POST /rerank``: a query (the
first words of the request's first text) and the request's texts as its passages.

Each request is encoded once, before the run, into the exact bytes
of an HTTP/1.1 request (request line, headers, JSON body), so sending costs one write.
Responses are classified from their status and ``X-Reason`` header into the report's
outcomes:

* ``ok``: any 2xx;
* ``rejected``: 429 and 503 (``queue_full``, ``infeasible``, ``draining``, ``not_ready``);
* ``timed_out``: 504 from the server, or the client gave up (status 0, reason
  ``client_timeout``);
* ``error``: everything else, including a failed connection (status 0).

A request's class of work travels in ``X-Priority`` (and, for KServe, in
``parameters.priority``), its tenant in ``X-Tenant``. The server's contract: the deadline
travels in ``X-Request-Timeout`` (decimal seconds) and,
for KServe, also in ``parameters.timeout`` (integer microseconds); with
``absolute_deadline``, also in ``X-Request-Deadline`` (Unix epoch seconds), whose value is a
fixed-width placeholder in the encoded bytes, filled in when the request is written
(:func:`with_deadline`). Timing headers
(``X-Batch-Id`` and friends) hold one value per input, comma-separated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import Enum
from urllib.parse import quote

from batchserve.loadgen.config import LoadConfig

__all__ = [
    "CLIENT_TIMEOUT",
    "Outcome",
    "classify",
    "encode_request",
    "request_body",
    "request_path",
    "request_texts",
    "rerank_query",
    "split_header_list",
    "with_deadline",
]

#: The header line of an absolute deadline, its value a placeholder of fixed width.
_DEADLINE_LINE = "X-Request-Deadline: " + "0" * 10 + ".000000"
_DEADLINE_VALUE = len("0" * 10 + ".000000")

#: The reason recorded when the client gives up on a request.
CLIENT_TIMEOUT = "client_timeout"


class Outcome(Enum):
    """How one request ended, as the report counts it."""

    OK = "ok"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"
    ERROR = "error"


def classify(status: int, reason: str | None = None) -> Outcome:
    """The outcome of a response with ``status`` (0: no response) and ``X-Reason``."""
    if 200 <= status < 300:
        return Outcome.OK
    if status in (429, 503):
        return Outcome.REJECTED
    if status == 504 or (status == 0 and reason == CLIENT_TIMEOUT):
        return Outcome.TIMED_OUT
    return Outcome.ERROR


def request_path(config: LoadConfig) -> str:
    """The request's path, including the URL's prefix."""
    if config.api == "openai":
        path = "/v1/embeddings"
    elif config.api == "rerank":
        path = "/rerank"
    else:
        path = f"/v2/models/{quote(config.model, safe='')}/infer"
    return config.target.prefix + path


def request_body(config: LoadConfig, texts: Sequence[str]) -> dict[str, object]:
    """The JSON body of one request carrying ``texts``."""
    if config.api == "openai":
        payload: object = texts[0] if len(texts) == 1 else list(texts)
        return {"model": config.model, "input": payload, "encoding_format": "float"}
    if config.api == "rerank":
        return {"model": config.model, "query": rerank_query(texts[0]), "texts": list(texts)}
    body: dict[str, object] = {
        "inputs": [
            {
                "name": config.kserve_input,
                "shape": [len(texts)],
                "datatype": "BYTES",
                "data": list(texts),
            }
        ]
    }
    params: dict[str, object] = {}
    if config.timeout_s is not None:
        params["timeout"] = round(config.timeout_s * 1e6)
    if config.priority is not None:
        params["priority"] = int(config.priority) if config.priority.isdigit() else config.priority
    if params:
        body["parameters"] = params
    return body


def rerank_query(text: str, words: int = 8) -> str:
    """A rerank request's query: the first ``words`` words of its first passage.

    A search query is a few words; its passages are the realistic mix of the texts.
    """
    return " ".join(text.split()[:words]) or text


def encode_request(config: LoadConfig, texts: Sequence[str]) -> bytes:
    """The complete HTTP/1.1 request (keep-alive) carrying ``texts``, ready to write."""
    body = json.dumps(request_body(config, texts), separators=(",", ":")).encode()
    lines = [
        f"POST {request_path(config)} HTTP/1.1",
        f"Host: {config.target.host_header}",
        "Content-Type: application/json",
        "Accept: application/json",
        f"Content-Length: {len(body)}",
    ]
    if config.api_key:
        lines.append(f"Authorization: Bearer {config.api_key}")
    if config.priority is not None:
        lines.append(f"X-Priority: {config.priority}")
    if config.tenant is not None:
        lines.append(f"X-Tenant: {config.tenant}")
    if config.timeout_s is not None:
        lines.append(f"X-Request-Timeout: {config.timeout_s:.6f}".rstrip("0").rstrip("."))
        if config.absolute_deadline:
            lines.append(_DEADLINE_LINE)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def with_deadline(data: bytes, epoch_s: float) -> bytes:
    """``data`` (from :func:`encode_request`) with its ``X-Request-Deadline`` set to ``epoch_s``.

    Requests without the header are returned as they are.
    """
    at = data.find(b"X-Request-Deadline: ")
    if at < 0:
        return data
    start = at + len("X-Request-Deadline: ")
    value = b"%017.6f" % epoch_s
    if len(value) != _DEADLINE_VALUE:  # past the year 2286, or before 1970
        return data
    return data[:start] + value + data[start + _DEADLINE_VALUE :]


def request_texts(config: LoadConfig, index: int) -> list[str]:
    """The texts request ``index`` carries: the next ``inputs_per_request``, cycling."""
    k = config.inputs_per_request
    n = len(config.texts)
    return [config.texts[(index * k + j) % n] for j in range(k)]


def split_header_list(value: bytes) -> list[bytes]:
    """A comma-separated header value as its stripped, non-empty items."""
    return [v for v in (p.strip() for p in value.split(b",")) if v]
