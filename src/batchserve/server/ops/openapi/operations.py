"""Triton's extensions and the operations endpoints.

Triton's model configuration, statistics and repository index (protocols.triton), the live
status (ops.live) and the dashboard (ops.dashboard). The schemas state what every answer
holds, so a generated test can check the answers against them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchserve.models.kinds import ITEMS, KINDS
from batchserve.server.ops.openapi.common import ok_response

__all__ = ["operation_paths", "operation_schemas"]

#: The error answers of the reasons given (the caller's error body).
_Errors = Callable[[list[str]], dict[str, Any]]


def _get(summary: str, description: str, tag: str, schema: str | None) -> dict[str, Any]:
    return {
        "summary": summary,
        "description": description,
        "tags": [tag],
        "responses": {"200": ok_response(schema) if schema else {"description": "OK"}},
    }


def operation_paths(model_param: dict[str, Any], errors: _Errors) -> dict[str, Any]:
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
                    "200": ok_response("RepositoryIndex"),
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


def operation_schemas() -> dict[str, Any]:
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
