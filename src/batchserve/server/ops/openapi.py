"""The OpenAPI 3.1 description of every endpoint.

The spec is written by hand from the same constants the server uses (the status table, the
header names), so the documented contract and the behaviour cannot drift apart silently:
tests compare the routes the app serves with the paths listed here. The ``/docs`` page is
rendered from it (:mod:`batchserve.server.ops.docs_page`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchserve import __version__
from batchserve.models.kinds import ITEMS, KINDS
from batchserve.server.deadlines import GRPC_TIMEOUT_PATTERN, TIMEOUT_HEADER, WHEN_HEADER
from batchserve.server.exchange import SERVER_TIMING, TIMING_HEADERS
from batchserve.server.protocols.kserve import MAX_TENSORS
from batchserve.server.protocols.tensors import DTYPES, MAX_DIMS
from batchserve.server.settings import RequestLimits
from batchserve.server.statuses import RETRY_REASONS, STATUS_TABLE
from batchserve.units import POSITIVE_DURATION_PATTERN

__all__ = ["openapi_spec"]

#: The headers that place a request in a class of work and a tenant (models with classes).
_CLASS_PARAMS = [
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

_DEADLINE_PARAMS = [
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


def _error_responses(reasons: list[str], schema: str) -> dict[str, Any]:
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


_INFER_ERRORS = [
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


def _timing_headers() -> dict[str, Any]:
    headers: dict[str, Any] = {
        name: {
            "description": desc + " Comma-separated, in input order.",
            "schema": {"type": "string"},
        }
        for name, desc in TIMING_HEADERS.items()
    }
    headers[SERVER_TIMING] = _SERVER_TIMING
    return headers


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _simple(summary: str, description: str, tag: str, errors: list[str] | None = None) -> Any:
    responses: dict[str, Any] = {"200": {"description": "OK"}}
    responses.update(_error_responses(errors or [], "KServeError"))
    return {"summary": summary, "description": description, "tags": [tag], "responses": responses}


#: TEI's error body's fields.
_TEI_ERROR = {
    "error": {"type": "string"},
    "error_type": {"enum": ["unhealthy", "backend", "overloaded", "validation", "empty"]},
}

#: FastAPI's validation error list, as Infinity answers a 422: the field and the rule.
_FASTAPI_DETAIL = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["loc", "msg", "type"],
        "properties": {
            "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
            "msg": {"type": "string"},
            "type": {"type": "string", "description": "The server's reason."},
        },
    },
}


def _schemas(models: list[str], limits: RequestLimits, dimensions: list[int]) -> dict[str, Any]:
    # The limits are stated in words, not as maxItems/maxLength: they are settings of the
    # deployment, and a request over one is answered 413, like a body over the byte limit.
    text = {"type": "string", "minLength": 1}
    tensor = {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": {"type": "string"},
            "datatype": {"enum": ["BYTES", *DTYPES]},
            "shape": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "maxItems": MAX_DIMS,
            },
            "data": {"type": "array", "description": "Row-major elements (JSON mode)."},
            "parameters": {
                "type": "object",
                "properties": {"binary_data_size": {"type": "integer"}},
            },
        },
    }
    schemas: dict[str, Any] = {
        "EmbeddingsRequest": {
            "type": "object",
            "required": ["input"],
            "properties": {
                "input": {
                    "description": f"A text, or a list of at most {limits.max_inputs} texts "
                    f"(--max-inputs), each of at most {limits.max_input_chars} characters "
                    "(--max-input-chars), none empty; over a limit: 413.",
                    "oneOf": [text, {"type": "array", "items": text, "minItems": 1}],
                },
                # The optional fields may also be null, which means the same as absent.
                "model": {
                    "type": ["string", "null"],
                    "enum": [*models, None],
                    "description": "Default: the first served model.",
                },
                "encoding_format": {"enum": ["float", "base64", None], "default": "float"},
                "dimensions": {
                    "type": ["integer", "null"],
                    "description": "Keep the first N values, renormalised; at most the "
                    "model's own dimension.",
                    "minimum": 1,
                    **({"maximum": max(dimensions)} if dimensions else {}),
                },
                "user": {"type": ["string", "null"], "description": "Ignored."},
            },
        },
        "EmbeddingsResponse": {
            "type": "object",
            "properties": {
                "object": {"const": "list"},
                "model": {"type": "string"},
                "data": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "object": {"const": "embedding"},
                            "index": {"type": "integer"},
                            "embedding": {
                                "oneOf": [
                                    {"type": "array", "items": {"type": "number"}},
                                    {"type": "string", "description": "base64 float32 LE"},
                                ]
                            },
                        },
                    },
                },
                "usage": {
                    "type": "object",
                    "properties": {
                        "prompt_tokens": {"type": "integer"},
                        "total_tokens": {"type": "integer"},
                    },
                },
            },
        },
        "OpenAIError": {
            "type": "object",
            "properties": {
                "error": {
                    "type": "object",
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "param": {"type": ["string", "null"]},
                        "code": {"enum": sorted(STATUS_TABLE)},
                    },
                }
            },
        },
        "KServeError": {"type": "object", "properties": {"error": {"type": "string"}}},
        "InfinityError": {
            "type": "object",
            "description": "Infinity's (OpenAI-style) error, and FastAPI's `detail` list, "
            "which Infinity's generated client parses on a 422.",
            "properties": {
                "error": {
                    "type": "object",
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"enum": sorted(STATUS_TABLE)},
                        "param": {"type": ["string", "null"]},
                        "code": {"type": "integer", "description": "The HTTP status."},
                    },
                },
                "detail": _FASTAPI_DETAIL,
            },
        },
        "TEIError": {"type": "object", "properties": _TEI_ERROR},
        "RerankError": {
            "type": "object",
            "description": "TEI's error, and FastAPI's `detail` list for Infinity's clients "
            "(the path is both servers').",
            "properties": {**_TEI_ERROR, "detail": _FASTAPI_DETAIL},
        },
        "CohereError": {"type": "object", "properties": {"message": {"type": "string"}}},
        "CohereJinaError": {
            "type": "object",
            "description": "Cohere's `message`, and the same text as Jina's `detail`, which "
            "Jina's clients raise for any answer without `results`.",
            "properties": {"message": {"type": "string"}, "detail": {"type": "string"}},
        },
        "Tensor": tensor,
        "InferRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "parameters": {
                    "type": "object",
                    "properties": {
                        "timeout": {
                            "type": "integer",
                            "description": "Timeout in microseconds, as Triton reads it.",
                        },
                        "priority": {
                            "description": "Class of work, as Triton's priority: a level "
                            "(1 = the first class, 0 = the default) or a class name. Read "
                            "only by models with classes; takes precedence over `X-Priority`.",
                            "oneOf": [{"type": "integer"}, {"type": "string"}],
                        },
                        "binary_data_output": {"type": "boolean"},
                    },
                },
                "inputs": {
                    "type": "array",
                    "items": {"$ref": "#/components/schemas/Tensor"},
                    "minItems": 1,
                    "maxItems": MAX_TENSORS,
                },
                "outputs": {
                    "type": "array",
                    "maxItems": MAX_TENSORS,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "parameters": {
                                "type": "object",
                                "properties": {"binary_data": {"type": "boolean"}},
                            },
                        },
                    },
                },
            },
        },
        "InferResponse": {
            "type": "object",
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/Tensor"}},
            },
        },
    }
    schemas.update(_infinity_schemas(schemas, limits))
    return schemas


def _infinity_schemas(schemas: dict[str, Any], limits: RequestLimits) -> dict[str, Any]:
    """Infinity's ``/embeddings`` (OpenAI's shape, with its differences) and ``/models``."""
    openai_request = schemas["EmbeddingsRequest"]["properties"]
    text = {"type": "string"}
    counts = {"type": "integer", "minimum": 0}
    model = {
        "type": "object",
        "required": ["id", "object", "stats", "capabilities"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "stats": {
                "type": "object",
                "properties": {
                    "queue_fraction": {"type": "number", "minimum": 0},
                    "queue_absolute": counts,
                    "results_pending": counts,
                    "batch_size": counts,
                },
            },
            "backend": {"type": "string"},
            "capabilities": {
                "type": "array",
                "items": {"enum": ["embed", "rerank", "classify"]},
                "description": "What the model's kind answers: `embed` (an embedder), "
                "`rerank` (a reranker), `classify` (a classifier); none for another model.",
            },
            "kind": {"enum": [*KINDS, None]},
            "state": {"enum": ["loading", "ready", "failed"]},
        },
    }
    return {
        "InfinityEmbeddingsRequest": {
            "type": "object",
            "required": ["input"],
            "properties": {
                **openai_request,
                "input": {
                    "description": f"A text, or a list of at most {limits.max_inputs} texts "
                    f"(--max-inputs), each of at most {limits.max_input_chars} characters "
                    "(--max-input-chars); an empty text is embedded, as Infinity does. Over "
                    "a limit: 413.",
                    "oneOf": [text, {"type": "array", "items": text, "minItems": 1}],
                },
                "model": {
                    "type": ["string", "null"],
                    "minLength": 1,
                    "description": "A served model; with one model served, any name (and "
                    "`default/not-specified`, what infinity_client sends) is that model, "
                    "as Infinity resolves it.",
                },
                "dimensions": {
                    **openai_request["dimensions"],
                    "minimum": 0,
                    "description": "0 or absent: the model's own (Infinity's default); else "
                    "the first N values, renormalised, at most the model's own dimension.",
                },
                "modality": {
                    "enum": ["text", None],
                    "description": "Only texts are embedded here.",
                },
            },
        },
        "InfinityEmbeddingsResponse": {
            "type": "object",
            "properties": {
                **schemas["EmbeddingsResponse"]["properties"],
                "id": {"type": "string"},
                "created": {"type": "integer"},
            },
        },
        "InfinityModels": {
            "type": "object",
            "required": ["object", "data"],
            "properties": {
                "object": {"const": "list"},
                "data": {"type": "array", "items": model},
            },
        },
    }


# -- Triton's extensions and the operations endpoints -----------------------------------
# Triton's model configuration, statistics and repository index (protocols.triton), the
# live status (ops.live) and the dashboard (ops.dashboard). The schemas state what every
# answer holds, so a generated test can check the answers against them.

_Errors = Callable[[list[str]], dict[str, Any]]


def _ok(schema: str) -> dict[str, Any]:
    return {
        "description": "OK",
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }


def _get(summary: str, description: str, tag: str, schema: str | None) -> dict[str, Any]:
    return {
        "summary": summary,
        "description": description,
        "tags": [tag],
        "responses": {"200": _ok(schema) if schema else {"description": "OK"}},
    }


def _operation_paths(model_param: dict[str, Any], errors: _Errors) -> dict[str, Any]:
    """The paths; ``model_param`` is the ``{name}`` parameter, ``errors`` the error answers."""
    config = _get(
        "Model configuration (Triton's extension)",
        "Triton's model configuration, from the settings in force: `max_batch_size`, "
        "`dynamic_batching` (`max_queue_delay_microseconds` is --max-wait; the queue "
        "policy's size and timeout are --queue-size and --timeout), the instance count "
        "(--workers), and the inputs and outputs with Triton's types, the batch axis left "
        "out of `dims`. What perf_analyzer and tritonclient's `get_model_config` read. Also "
        "served under `/v2/models/{name}/versions/1/config`.",
        "Triton",
        "ModelConfig",
    )
    stats = _get(
        "Model statistics (Triton's extension)",
        "Counts and cumulative nanoseconds since the start, from the server's own "
        "accounting: `success` (requests answered 200, arrival to answer), `fail` (late, "
        "refused, expired, cancelled, failed), `queue` and `compute_infer` per item "
        "(admission to its pass; the pass), `batch_stats` per batch size. Also served under "
        "`/v2/models/{name}/versions/1/stats`.",
        "Triton",
        "ModelStatistics",
    )
    for op in (config, stats):
        op["parameters"] = [model_param]
        op["responses"].update(errors(["not_found"]))
    return {
        "/v2/models/{name}/config": {"get": config},
        "/v2/models/{name}/stats": {"get": stats},
        "/v2/models/stats": {
            "get": _get(
                "Every model's statistics (Triton's extension)",
                "As `/v2/models/{name}/stats`, one entry per served model.",
                "Triton",
                "ModelStatistics",
            )
        },
        "/v2/repository/index": {
            "post": {
                "summary": "Repository index (Triton's extension)",
                "description": "Every served model with its version, state (`READY`, "
                "`LOADING`, `UNAVAILABLE`) and why a load failed. The body is optional; "
                '`{"ready": true}` lists only the models that serve.',
                "tags": ["Triton"],
                "requestBody": {
                    "required": False,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"ready": {"type": "boolean"}},
                            }
                        }
                    },
                },
                "responses": {
                    "200": _ok("RepositoryIndex"),
                    **errors(["malformed", "invalid", "too_large", "request_timeout"]),
                },
            }
        },
        "/status": {
            "get": _get(
                "Live status (JSON)",
                "What `/dashboard` and `batchserve top` show: per model, requests by outcome, "
                "refusals and other errors by reason, queue depth, the batch size "
                "distribution, queue wait and forward p50/p99 over the latest items and "
                "passes, the cost model's fit beside the measured passes. Built on demand "
                "from the server's counters. Open.",
                "Operations",
                "Status",
            )
        },
        "/dashboard": {
            "get": _get(
                "Live dashboard",
                "One self-contained HTML page (it loads nothing from elsewhere) that polls "
                "`/status` once a second. Open.",
                "Operations",
                None,
            )
        },
    }


def _object(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **optional},
    }


_INT = {"type": "integer", "minimum": 0}
_NUMBER = {"type": "number"}
_DURATION = _object({"count": _INT, "ns": _INT})
_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
_COUNTS = {"type": "object", "additionalProperties": _INT}
_QUANTILES = _object(
    {"p50": {"type": ["number", "null"]}, "p99": {"type": ["number", "null"]}, "n": _INT}
)


def _operation_schemas() -> dict[str, Any]:
    """The schemas the paths refer to."""
    tensor = _object(
        {
            "name": {"type": "string"},
            "data_type": {"type": "string", "pattern": "^TYPE_"},
            "dims": {"type": "array", "items": {"type": "integer"}},
        }
    )
    model_status = _object(
        {
            "state": {"enum": ["loading", "ready", "failed"]},
            # None while the model loads; item: what one item, the unit of every count, is.
            "kind": {"enum": [*KINDS, None]},
            "item": {"enum": [*ITEMS, None]},
            "settings": {"type": "object"},
            "requests": _COUNTS,
            "refusals": _COUNTS,
            "errors": _COUNTS,
            "queue": _object({"depth": _INT, "size": _INT, "running_items": _INT}),
            "batches": _object(
                {"passes": _INT, "items": _INT, "mean_size": _NUMBER, "sizes": _COUNTS}
            ),
            "queue_wait_s": _QUANTILES,
            "forward_s": _QUANTILES,
            "cost": _object(
                {
                    "fixed_s": {"type": ["number", "null"]},
                    "per_item_s": {"type": ["number", "null"]},
                    "samples": _INT,
                    "measured": {"type": "array"},
                }
            ),
        }
    )
    return {
        "ModelConfig": _object(
            {
                "name": {"type": "string"},
                "max_batch_size": _INT,
                "input": {"type": "array", "items": tensor},
                "output": {"type": "array", "items": tensor},
                "dynamic_batching": _object(
                    {
                        "max_queue_delay_microseconds": _INT,
                        "default_queue_policy": {"type": "object"},
                    }
                ),
                "instance_group": {"type": "array"},
            }
        ),
        "ModelStatistics": _object(
            {
                "model_stats": {
                    "type": "array",
                    "items": _object(
                        {
                            "name": {"type": "string"},
                            "version": {"type": "string"},
                            "last_inference": _INT,
                            "inference_count": _INT,
                            "execution_count": _INT,
                            "inference_stats": _object(dict.fromkeys(_DURATIONS, _DURATION)),
                            "batch_stats": {"type": "array"},
                        }
                    ),
                }
            }
        ),
        "RepositoryIndex": {
            "type": "array",
            "items": _object(
                {
                    "name": {"type": "string"},
                    "version": {"type": "string"},
                    "state": {"enum": ["READY", "LOADING", "UNAVAILABLE", "UNKNOWN"]},
                    "reason": {"type": "string"},
                }
            ),
        },
        "Status": _object(
            {
                "time_unix": _NUMBER,
                "uptime_s": _NUMBER,
                "draining": {"type": "boolean"},
                "received": _INT,
                "in_flight": _INT,
                "requests": _COUNTS,
                "models": {"type": "object", "additionalProperties": model_status},
            }
        ),
    }


def openapi_spec(
    models: list[str],
    *,
    secured: bool = True,
    limits: RequestLimits | None = None,
    dimensions: list[int] | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the server serving ``models``.

    Args:
        models: the served models' names.
        secured: whether inference and model listing need the API key (``--api-key``); the
            document states it only then.
        limits: the request limits, stated in the schemas (the defaults if None).
        dimensions: the embedding dimensions the served models produce, if known: OpenAI's
            ``dimensions`` accepts up to the largest.
    """
    security: dict[str, Any] = {"security": [{"bearer": []}]} if secured else {}
    limits = limits if limits is not None else RequestLimits()
    model_param = {"name": "name", "in": "path", "required": True, "schema": {"enum": models}}
    ok_infer = {
        "description": "One answer per input, in order.",
        "headers": _timing_headers(),
    }
    paths: dict[str, Any] = {
        "/v1/embeddings": {
            "post": {
                "summary": "Embed texts (OpenAI)",
                "description": "Each input is batched separately and may share a forward pass "
                "with other requests; the answer keeps the input order. Works with the "
                "official `openai` client (`client.embeddings.create`).",
                "tags": ["OpenAI"],
                **security,
                "parameters": [*_DEADLINE_PARAMS, *_CLASS_PARAMS],
                "requestBody": {
                    "required": True,
                    "content": _json({"$ref": "#/components/schemas/EmbeddingsRequest"}),
                },
                "responses": {
                    "200": {
                        **ok_infer,
                        "content": _json({"$ref": "#/components/schemas/EmbeddingsResponse"}),
                    },
                    **_error_responses(_INFER_ERRORS, "OpenAIError"),
                },
            }
        },
        "/embeddings": {
            "post": {
                "summary": "Embed texts (Infinity)",
                "description": "Infinity's `/embeddings`: OpenAI's shape, as "
                "`/v1/embeddings`, with Infinity's `dimensions: 0` (the model's own), "
                "`modality` (`text` only), `id` and `created`; an empty text is embedded. "
                "Errors carry Infinity's `error` and FastAPI's `detail` list. For "
                "`infinity_client` and code written against an Infinity URL.",
                "tags": ["Infinity"],
                **security,
                "parameters": [*_DEADLINE_PARAMS, *_CLASS_PARAMS],
                "requestBody": {
                    "required": True,
                    "content": _json({"$ref": "#/components/schemas/InfinityEmbeddingsRequest"}),
                },
                "responses": {
                    "200": {
                        **ok_infer,
                        "content": _json(
                            {"$ref": "#/components/schemas/InfinityEmbeddingsResponse"}
                        ),
                    },
                    **_error_responses([*_INFER_ERRORS, "wrong_kind"], "InfinityError"),
                },
            }
        },
        "/models": {
            "get": {
                "summary": "List the served models (Infinity)",
                "description": "Each model's name, `capabilities` by kind, `backend`, and "
                "`stats` of its queue, as Infinity lists them (no `owned_by`).",
                "tags": ["Infinity"],
                **security,
                "responses": {
                    "200": _ok("InfinityModels"),
                    **_error_responses(["unauthorized"], "OpenAIError"),
                },
            }
        },
        "/v1/models": {
            "get": {
                "summary": "List the served models (OpenAI)",
                "tags": ["OpenAI"],
                **security,
                "responses": {
                    "200": {"description": "OK"},
                    **_error_responses(["unauthorized"], "OpenAIError"),
                },
            }
        },
        "/v1/models/{name}": {
            "get": {
                "summary": "One served model (OpenAI)",
                "tags": ["OpenAI"],
                **security,
                "parameters": [model_param],
                "responses": {
                    "200": {"description": "OK"},
                    **_error_responses(["unauthorized", "not_found"], "OpenAIError"),
                },
            }
        },
        "/v2": {
            "get": _simple("Server metadata (KServe v2)", "Name, version, extensions.", "KServe")
        },
        "/v2/health/live": {
            "get": _simple("Liveness (KServe v2)", "200 while the process serves HTTP.", "Health")
        },
        "/v2/health/ready": {
            "get": _simple(
                "Readiness (KServe v2)",
                "200 when every model is loaded and the server is not draining.",
                "Health",
                ["not_ready", "draining"],
            )
        },
        "/v2/models/{name}": {
            "get": {
                **_simple(
                    "Model metadata (KServe v2)",
                    "Inputs and outputs (an embedding model: BYTES `text` [-1, 1] in, also "
                    "taken as [-1], FP32 "
                    "`embedding` [-1, dim] out).",
                    "KServe",
                    ["not_found"],
                ),
                "parameters": [model_param],
            }
        },
        "/v2/models/{name}/ready": {
            "get": {
                **_simple(
                    "Model readiness (KServe v2)",
                    "200 when the model serves.",
                    "KServe",
                    ["not_found", "not_ready", "draining"],
                ),
                "parameters": [model_param],
            }
        },
        "/v2/models/{name}/infer": {
            "post": {
                "summary": "Inference (KServe v2 / Open Inference Protocol)",
                "description": "JSON, or JSON followed by binary tensor data (Triton's binary "
                "tensor data extension: header `Inference-Header-Content-Length`), as "
                "`tritonclient.http` sends by default. `parameters.timeout` (microseconds) "
                "and the `X-Request-Timeout` header both bound the deadline. Also served "
                "under `/v2/models/{name}/versions/{version}/...`.",
                "tags": ["KServe"],
                **security,
                "parameters": [
                    model_param,
                    *_DEADLINE_PARAMS,
                    *_CLASS_PARAMS,
                    {
                        "name": "Inference-Header-Content-Length",
                        "in": "header",
                        "required": False,
                        "description": "Bytes of JSON before the binary tensor data.",
                        "schema": {"type": "integer"},
                    },
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        **_json({"$ref": "#/components/schemas/InferRequest"}),
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        },
                    },
                },
                "responses": {
                    "200": {
                        **ok_infer,
                        "content": _json({"$ref": "#/components/schemas/InferResponse"}),
                    },
                    **_error_responses(_INFER_ERRORS, "KServeError"),
                },
            }
        },
        "/metrics": {
            "get": _simple(
                "Prometheus metrics",
                "Requests by outcome and reason, queue depth, queue wait, batch size, forward "
                "time and latency histograms, the fitted cost model; per model. Open.",
                "Operations",
            )
        },
        "/openapi.json": {"get": _simple("This document", "OpenAPI 3.1, JSON.", "Documentation")},
        "/docs": {"get": _simple("Documentation page", "HTML.", "Documentation")},
        "/": {"get": _simple("Index", "Server name, models, links.", "Documentation")},
    }
    paths.update(_operation_paths(model_param, lambda rs: _error_responses(rs, "KServeError")))
    for path, operations in _task_paths(security, ok_infer, sorted(set(dimensions or []))).items():
        paths.setdefault(path, {}).update(operations)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "batchserve",
            "version": __version__,
            "description": "A model server built around dynamic batching. Every inference "
            "answer carries the headers " + ", ".join(TIMING_HEADERS) + "; every error "
            "carries X-Reason, and refusals (429, 503) carry Retry-After and Retry-After-Ms. "
            f"A request's deadline: the header {TIMEOUT_HEADER} (or {WHEN_HEADER}, "
            "grpc-timeout, x-envoy-expected-rq-timeout-ms), counted from its first byte. Every "
            "inference answer, refusals included, carries Server-Timing: the server's own "
            "time for the request, arrival to answer.",
        },
        "paths": paths,
        "components": {
            "schemas": {
                **_schemas(models, limits, sorted(set(dimensions or []))),
                **_operation_schemas(),
            },
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Needed only when the server runs with --api-key (or "
                    "BATCHSERVE_API_KEY); health, metrics and docs stay open.",
                }
            },
        },
    }


#: The task routes: (path, summary, description, tag, error schema).
_TASKS = [
    (
        "/embed",
        "Embed texts (TEI)",
        "`inputs` (a text or a list), `truncate`, `normalize`, `dimensions` (the first N "
        "values, renormalised). An empty text is embedded (its special tokens alone), as TEI "
        "does. An embedding model.",
        "TEI",
        "TEIError",
    ),
    (
        "/rerank",
        "Rerank passages (TEI; Infinity and Jina with `documents`)",
        "`query` and `texts` (TEI: a list of `{index, score, text?}` by score), or `query` "
        "and `documents` (Infinity: `{object, results, model, usage}`). Each passage is one "
        "item of the batcher; the answer is whole or refused whole. A passage may be empty "
        "(it is scored), the query not. Errors carry TEI's `error` and FastAPI's `detail` "
        "list (Infinity's). A reranker.",
        "Rerank",
        "RerankError",
    ),
    (
        "/predict",
        "Classify texts or pairs (TEI)",
        "`inputs`: a text, a pair, or a batch of them; `raw_scores`. A classifier (or a "
        "reranker, one label).",
        "TEI",
        "TEIError",
    ),
    (
        "/similarity",
        "Sentence similarity (TEI)",
        "`inputs: {source_sentence, sentences}`: one cosine per sentence. An embedding model.",
        "TEI",
        "TEIError",
    ),
    (
        "/",
        "The model's own task (TEI, Hugging Face InferenceClient)",
        "An embedder embeds (an empty text too, as TEI does) or, with `inputs: "
        "{source_sentence, sentences}`, compares; a classifier classifies "
        "(`parameters.top_k`, `parameters.function_to_apply`; an empty text is refused); a "
        "reranker reranks.",
        "TEI",
        "TEIError",
    ),
    (
        "/v2/rerank",
        "Rerank (Cohere v2)",
        "`model`, `query`, `documents` (an empty one is scored), `top_n`, "
        "`max_tokens_per_doc` -> `{id, results: [{index, relevance_score}], meta}`. A "
        "reranker.",
        "Rerank",
        "CohereError",
    ),
    (
        "/v1/rerank",
        "Rerank (Cohere v1, Jina)",
        "`documents` as strings (an empty one is scored) or objects of strings: their "
        "`text`, or with `rank_fields` those fields as `key: value` lines, as Cohere ranks "
        "them; `top_n`, `return_documents` (default true) -> `{id, model, results, usage, "
        "meta}`, each document as sent. Errors carry Cohere's `message` and Jina's `detail`. "
        "A reranker.",
        "Rerank",
        "CohereJinaError",
    ),
    (
        "/classify",
        "Classify texts (Infinity)",
        "`input` (texts), `raw_scores` -> `{object, data, model, usage}`. Errors carry "
        "Infinity's `error` and FastAPI's `detail` list. A classifier.",
        "Rerank",
        "InfinityError",
    ),
]

_TASK_ERRORS = [*_INFER_ERRORS, "wrong_kind", "empty"]


def _task_bodies(dimensions: list[int]) -> dict[str, Any]:
    # The task routes' bodies: the fields that decide what is run (others are optional).
    # A query, a text to classify or compare must not be empty; a text to embed and a
    # passage to score may be (pipelines send a document without text as ``""``).
    text = {"type": "string", "minLength": 1}
    texts = {"type": "array", "items": text, "minItems": 1}
    passage = {"type": "string"}
    passages = {"type": "array", "items": passage, "minItems": 1}
    documents = {
        "type": "array",
        "minItems": 1,
        "items": {
            "anyOf": [
                passage,
                {
                    "type": "object",
                    "description": "A document of string fields: its `text` is ranked, or "
                    "with `rank_fields` those fields.",
                    "additionalProperties": {"type": "string"},
                },
            ]
        },
    }
    flag = {"type": ["boolean", "null"]}
    count = {"type": ["integer", "null"], "minimum": 1}
    similarity = {
        "type": "object",
        "required": ["source_sentence", "sentences"],
        "properties": {"source_sentence": text, "sentences": texts},
    }
    dims = {**count, **({"maximum": max(dimensions)} if dimensions else {})}
    pair = {"type": "array", "items": text, "minItems": 1, "maxItems": 2}
    rerank: dict[str, Any] = {"model": {"type": ["string", "null"]}, "query": text}
    ranked = {
        **rerank,
        "top_n": count,
        "max_tokens_per_doc": count,
        "max_chunks_per_doc": count,
    }
    cohere = {
        "type": "object",
        "required": ["query", "documents"],
        "properties": {
            **ranked,
            "documents": documents,
            "rank_fields": {"type": ["array", "null"], "items": text, "minItems": 1},
            "return_documents": flag,
        },
    }
    return {
        "/embed": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "inputs": {"oneOf": [passage, passages]},
                "truncate": flag,
                "normalize": flag,
                "dimensions": dims,
            },
        },
        "/similarity": {
            "type": "object",
            "required": ["inputs"],
            "properties": {"inputs": similarity},
        },
        "/": {
            "type": "object",
            "required": ["inputs"],
            "properties": {"inputs": {"oneOf": [passage, passages, similarity]}},
        },
        "/rerank": {
            "oneOf": [
                {
                    "type": "object",
                    "required": ["query", "texts"],
                    "properties": {
                        **rerank,
                        "texts": passages,
                        "raw_scores": flag,
                        "return_text": flag,
                        "truncate": flag,
                    },
                },
                {
                    "type": "object",
                    "required": ["query", "documents"],
                    "properties": {
                        **ranked,
                        "documents": passages,
                        "raw_scores": flag,
                        "return_documents": flag,
                    },
                },
            ]
        },
        "/predict": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "inputs": {"oneOf": [text, pair, {"type": "array", "items": pair, "minItems": 1}]},
                "raw_scores": flag,
            },
        },
        "/v2/rerank": cohere,
        "/v1/rerank": cohere,
        "/tokenize": {
            "type": "object",
            "required": ["inputs"],
            "properties": {"inputs": {"oneOf": [text, texts]}, "add_special_tokens": flag},
        },
        "/decode": {
            "type": "object",
            "required": ["ids"],
            "properties": {
                "ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
            },
        },
        "/classify": {
            "type": "object",
            "required": ["input"],
            "properties": {"input": {"oneOf": [text, texts]}, "raw_scores": flag},
        },
    }


def _task_paths(
    security: dict[str, Any], ok_infer: dict[str, Any], dimensions: list[int]
) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    bodies = _task_bodies(dimensions)
    for path, summary, description, tag, error in _TASKS:
        paths[path] = {
            "post": {
                "summary": summary,
                "description": description + " A route of another kind of model answers 400 "
                "`wrong_kind`, naming the route to use. Inputs over the model's window are "
                "truncated (counted in `X-Truncated-Inputs`) unless `truncate` is false.",
                "tags": [tag],
                **security,
                "parameters": [*_DEADLINE_PARAMS, *_CLASS_PARAMS],
                "requestBody": {"required": True, "content": _json(bodies[path])},
                "responses": {
                    "200": {**ok_infer, "content": _json({})},
                    **_error_responses(_TASK_ERRORS, error),
                },
            }
        }
    paths["/info"] = {
        "get": _simple(
            "Model information (TEI)",
            "The default model's id, kind (`model_type`), window and limits, as TEI's.",
            "TEI",
        )
    }
    for path, summary, description in (
        (
            "/tokenize",
            "Tokenize (TEI)",
            "`inputs` (a text or a list), `add_special_tokens`: one list of `{id, text, "
            "special, start, stop}` per input. Not batched.",
        ),
        (
            "/decode",
            "Decode token ids (TEI)",
            "`ids` (a list, or a list of lists), `skip_special_tokens`: one text per list.",
        ),
    ):
        paths[path] = {
            "post": {
                **_simple(summary, description, "TEI", ["malformed", "invalid", "wrong_kind"]),
                "requestBody": {"required": True, "content": _json(bodies[path])},
            }
        }
    paths["/health"] = {
        "get": {
            "summary": "Health (TEI, Infinity)",
            "description": "200 when every model serves, with Infinity's body (its clients "
            "read it; TEI's read the status alone); else 503 with TEI's error.",
            "tags": ["Health"],
            "responses": {
                "200": {
                    "description": "OK",
                    "content": _json(
                        {
                            "type": "object",
                            "required": ["unix"],
                            "properties": {
                                "unix": {"type": "number", "description": "Unix seconds."}
                            },
                        }
                    ),
                },
                "503": {
                    "description": "A model is still loading, or the server is draining.",
                    "content": _json({"$ref": "#/components/schemas/TEIError"}),
                },
            },
        }
    }
    return paths
