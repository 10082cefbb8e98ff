"""What every part of the OpenAPI description shares.

The deadline and class headers, the error answers by reason (from the status table), the
timing headers, and small builders of operations and responses.
"""

from __future__ import annotations

from typing import Any

from batchserve.server.deadlines import GRPC_TIMEOUT_PATTERN, TIMEOUT_HEADER, WHEN_HEADER
from batchserve.server.exchange import SERVER_TIMING, TIMING_HEADERS
from batchserve.server.protocols.window import TRUNCATED_HEADER
from batchserve.server.statuses import RETRY_REASONS, STATUS_TABLE
from batchserve.units import POSITIVE_DURATION_PATTERN

__all__ = [
    "CLASS_PARAMS",
    "DEADLINE_PARAMS",
    "INFER_ERRORS",
    "error_responses",
    "json_content",
    "ok_response",
    "simple_op",
    "timing_headers",
]

#: The headers that place a request in a class of work and a tenant (models with classes).
CLASS_PARAMS = [
    {
        "name": "X-Priority",
        "in": "header",
        "required": False,
        "description": "This request's class of work, for a model served with classes "
        "(`serve --class`): a class name (`interactive`, `bulk`) or a level, 1 = the first, "
        "most urgent class, 0 = the default class (Triton's numbering). Its class sets its "
        "default deadline, its share of every forward pass and of the queue, and its "
        "`Retry-After`. An unknown name or a level out of range is answered 422 `invalid`. "
        "A model without classes ignores it. KServe's `parameters.priority` in the body "
        "takes precedence.",
        # No length or pattern here: a model without classes ignores the header, whatever
        # it holds; one with classes answers 422 for a value it does not know.
        "schema": {"type": "string", "examples": ["interactive", "1"]},
    },
    {
        "name": "X-Tenant",
        "in": "header",
        "required": False,
        "description": "Who this request is for, when no tenant keys are configured (with "
        "tenant keys, the bearer key names the tenant and this header is ignored). Tenants "
        "share a class's passes by weight and each may hold at most `--tenant-share` of its "
        "queue. 1 to 64 printable characters without commas, else 422 `invalid`.",
        "schema": {"type": "string", "examples": ["search"]},
    },
]

DEADLINE_PARAMS = [
    {
        "name": TIMEOUT_HEADER,
        "in": "header",
        "required": False,
        "description": "This request's deadline, counted from its arrival (its first byte): "
        "seconds as a decimal (`0.25`) or with a unit (`250ms`, `2s`). The tightest of this "
        "and the other deadline headers wins; default: the model's `--timeout`. A request "
        "the cost model predicts cannot finish in time is refused at once (429 `infeasible`); "
        "one whose deadline has passed before it is admitted, or passes while queued or "
        "running, is answered 504.",
        "schema": {
            "type": "string",
            "pattern": POSITIVE_DURATION_PATTERN,
            "examples": ["0.25", "250ms"],
        },
    },
    {
        "name": WHEN_HEADER,
        "in": "header",
        "required": False,
        "description": "This request's deadline as an absolute time, Unix epoch seconds, for "
        "callers whose clocks are synchronised with the server's.",
        "schema": {"type": "string", "pattern": r"^[0-9]{1,12}(\.[0-9]{1,9})?$"},
    },
    {
        "name": "grpc-timeout",
        "in": "header",
        "required": False,
        "description": "gRPC's timeout, as proxies forward it: up to 8 digits and a unit "
        "(H, M, S, m, u, n), counted from the request's arrival.",
        "schema": {"type": "string", "pattern": GRPC_TIMEOUT_PATTERN},
    },
    {
        "name": "x-envoy-expected-rq-timeout-ms",
        "in": "header",
        "required": False,
        "description": "Envoy's expected request timeout, whole milliseconds (0: none).",
        "schema": {"type": "string", "pattern": r"^[0-9]{1,12}$"},
    },
]


def error_responses(reasons: list[str], schema: str) -> dict[str, Any]:
    """The error answers of ``reasons``, by status, each body a ``schema`` (a component)."""
    by_status: dict[int, list[str]] = {}
    for r in reasons:
        by_status.setdefault(STATUS_TABLE[r][0], []).append(r)
    out: dict[str, Any] = {}
    for status, rs in sorted(by_status.items()):
        headers: dict[str, Any] = {
            "X-Reason": {"description": "Machine-readable reason.", "schema": {"enum": rs}}
        }
        if any(r in RETRY_REASONS for r in rs):
            headers["Retry-After"] = {
                "description": "Seconds before a retry may be admitted (integer, >= 1).",
                "schema": {"type": "integer"},
            }
            headers["Retry-After-Ms"] = {
                "description": "The same in milliseconds.",
                "schema": {"type": "integer"},
            }
        out[str(status)] = {
            "description": "; ".join(f"`{r}`: {STATUS_TABLE[r][1]}" for r in rs),
            "headers": headers,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }
    return out


INFER_ERRORS = [
    "malformed",
    "request_timeout",
    "unsupported_media_type",
    "invalid",
    "too_large",
    "unauthorized",
    "not_found",
    "queue_full",
    "infeasible",
    "draining",
    "not_ready",
    "deadline_exceeded",
    "model_error",
    "internal",
]


_SERVER_TIMING = {
    "description": "The server's own time for the request, from its first byte to its "
    "answer: `total;dur=<milliseconds>` (also on refusals and errors of inference routes).",
    "schema": {"type": "string"},
}


def timing_headers() -> dict[str, Any]:
    """The headers inference answers carry (per-input timings, Server-Timing, truncation)."""
    headers: dict[str, Any] = {
        name: {
            "description": desc + " Comma-separated, in input order.",
            "schema": {"type": "string"},
        }
        for name, desc in TIMING_HEADERS.items()
    }
    headers[SERVER_TIMING] = _SERVER_TIMING
    headers[TRUNCATED_HEADER] = {
        "description": "How many inputs the model's window cut (truncated to its tokens); "
        "absent when none was. A request with `truncate: false` is refused instead (413).",
        "schema": {"type": "integer", "minimum": 1},
    }
    return headers


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON body of ``schema``."""
    return {"application/json": {"schema": schema}}


def simple_op(summary: str, description: str, tag: str, errors: list[str] | None = None) -> Any:
    """An operation answering 200, or ``errors`` in KServe's error body."""
    responses: dict[str, Any] = {"200": {"description": "OK"}}
    responses.update(error_responses(errors or [], "KServeError"))
    return {"summary": summary, "description": description, "tags": [tag], "responses": responses}


def ok_response(schema: str) -> dict[str, Any]:
    """A 200 answer whose JSON body is the component ``schema``."""
    return {
        "description": "OK",
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }
