"""The routes that describe the server: metadata, health, model listings, TEI's tools, docs.

KServe's server and model metadata and readiness, OpenAI's and Infinity's model listings,
TEI's ``/info``, ``/tokenize`` and ``/decode``, the health routes, the metrics, this
document and its page.
"""

from __future__ import annotations

from typing import Any

from batchserve.server.ops.openapi.common import (
    error_responses,
    json_content,
    ok_response,
    simple_op,
)
from batchserve.server.protocols.bodies import DECODE, TOKENIZE
from batchserve.server.protocols.fields import Served

__all__ = ["metadata_paths"]


def _with_model(op: dict[str, Any], model_param: dict[str, Any]) -> dict[str, Any]:
    return {**op, "parameters": [model_param]}


def _listings(security: dict[str, Any], model_param: dict[str, Any]) -> dict[str, Any]:
    unauthorized = error_responses(["unauthorized"], "OpenAIError")
    return {
        "/models": {
            "get": {
                "summary": "List the served models (Infinity)",
                "description": "Each model's name, `capabilities` by kind, `backend`, and "
                "`stats` of its queue, as Infinity lists them (no `owned_by`).",
                "tags": ["Infinity"],
                **security,
                "responses": {"200": ok_response("InfinityModels"), **unauthorized},
            }
        },
        "/v1/models": {
            "get": {
                "summary": "List the served models (OpenAI)",
                "tags": ["OpenAI"],
                **security,
                "responses": {"200": {"description": "OK"}, **unauthorized},
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
                    **error_responses(["unauthorized", "not_found"], "OpenAIError"),
                },
            }
        },
    }


def _kserve(model_param: dict[str, Any]) -> dict[str, Any]:
    return {
        "/v2": {
            "get": simple_op("Server metadata (KServe v2)", "Name, version, extensions.", "KServe")
        },
        "/v2/health/live": {
            "get": simple_op("Liveness (KServe v2)", "200 while the process serves HTTP.", "Health")
        },
        "/v2/health/ready": {
            "get": simple_op(
                "Readiness (KServe v2)",
                "200 when every model is loaded and the server is not draining.",
                "Health",
                ["not_ready", "draining"],
            )
        },
        "/v2/models/{name}": {
            "get": _with_model(
                simple_op(
                    "Model metadata (KServe v2)",
                    "Inputs and outputs (an embedding model: BYTES `text` [-1, 1] in, also "
                    "taken as [-1], FP32 `embedding` [-1, dim] out).",
                    "KServe",
                    ["not_found"],
                ),
                model_param,
            )
        },
        "/v2/models/{name}/ready": {
            "get": _with_model(
                simple_op(
                    "Model readiness (KServe v2)",
                    "200 when the model serves.",
                    "KServe",
                    ["not_found", "not_ready", "draining"],
                ),
                model_param,
            )
        },
    }


def _documentation() -> dict[str, Any]:
    return {
        "/metrics": {
            "get": simple_op(
                "Prometheus metrics",
                "Requests by outcome and reason, queue depth, queue wait, batch size, forward "
                "time and latency histograms, the fitted cost model; per model. Open.",
                "Operations",
            )
        },
        "/openapi.json": {"get": simple_op("This document", "OpenAPI 3.1, JSON.", "Documentation")},
        "/docs": {"get": simple_op("Documentation page", "HTML.", "Documentation")},
        "/": {"get": simple_op("Index", "Server name, models, links.", "Documentation")},
    }


def _tei(served: Served) -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/info": {
            "get": simple_op(
                "Model information (TEI)",
                "The default model's id, kind (`model_type`), window and limits, as TEI's.",
                "TEI",
            )
        }
    }
    for path, summary, description, body in (
        (
            "/tokenize",
            "Tokenize (TEI)",
            "`inputs` (a text or a list), `add_special_tokens`: one list of `{id, text, "
            "special, start, stop}` per input. Not batched.",
            TOKENIZE,
        ),
        (
            "/decode",
            "Decode token ids (TEI)",
            "`ids` (a list, or a list of lists), `skip_special_tokens`: one text per list.",
            DECODE,
        ),
    ):
        paths[path] = {
            "post": {
                **simple_op(summary, description, "TEI", ["malformed", "invalid", "wrong_kind"]),
                "requestBody": {"required": True, "content": json_content(body.schema(served))},
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
                    "content": json_content(
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
                    "content": json_content({"$ref": "#/components/schemas/TEIError"}),
                },
            },
        }
    }
    return paths


def metadata_paths(
    security: dict[str, Any], served: Served, model_param: dict[str, Any]
) -> dict[str, Any]:
    """The paths, by route and method.

    ``security`` as the model listings have it (the inference routes' key); ``served``
    what the bodies' schemas state; ``model_param`` the ``{name}`` parameter.
    """
    return {
        **_listings(security, model_param),
        **_kserve(model_param),
        **_documentation(),
        **_tei(served),
    }
