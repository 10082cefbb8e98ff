"""The OpenAPI 3.1 description of every endpoint.

The spec is written by hand from the same constants the server uses (the status table, the
header names), so the documented contract and the behaviour cannot drift apart silently:
tests compare the routes the app serves with the paths listed here. The ``/docs`` page is
rendered from it (:mod:`batchserve.server.ops.docs_page`).

One module a part: the shared pieces (:mod:`~batchserve.server.ops.openapi.common`), the
inference routes' schemas (:mod:`~batchserve.server.ops.openapi.schemas`), Triton's
extensions and the operations endpoints (:mod:`~batchserve.server.ops.openapi.operations`),
the task routes of TEI, Cohere, Jina and Infinity
(:mod:`~batchserve.server.ops.openapi.tasks`); this module assembles them.
"""

from __future__ import annotations

from typing import Any

from batchserve import __version__
from batchserve.server.deadlines import TIMEOUT_HEADER, WHEN_HEADER
from batchserve.server.exchange import TIMING_HEADERS
from batchserve.server.ops.openapi.common import (
    CLASS_PARAMS,
    DEADLINE_PARAMS,
    INFER_ERRORS,
    error_responses,
    json_content,
    ok_response,
    simple_op,
    timing_headers,
)
from batchserve.server.ops.openapi.operations import operation_paths, operation_schemas
from batchserve.server.ops.openapi.schemas import inference_schemas
from batchserve.server.ops.openapi.tasks import task_paths
from batchserve.server.protocols.fields import Served
from batchserve.server.settings import RequestLimits

__all__ = ["openapi_spec"]


def openapi_spec(
    models: list[str],
    *,
    secured: bool = True,
    limits: RequestLimits | None = None,
    dimensions: list[int] | None = None,
    prompts: list[str] | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the server serving ``models``.

    Args:
        models: the served models' names.
        secured: whether inference and model listing need the API key (``--api-key``); the
            document states it only then.
        limits: the request limits, stated in the schemas (the defaults if None).
        dimensions: the embedding dimensions the served models produce, if known: OpenAI's
            ``dimensions`` accepts up to the largest.
        prompts: the names of the prompts the served embedding models define: a
            ``prompt_name`` takes one of them.
    """
    security: dict[str, Any] = {"security": [{"bearer": []}]} if secured else {}
    limits = limits if limits is not None else RequestLimits()
    model_param = {"name": "name", "in": "path", "required": True, "schema": {"enum": models}}
    ok_infer = {
        "description": "One answer per input, in order.",
        "headers": timing_headers(),
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
                "parameters": [*DEADLINE_PARAMS, *CLASS_PARAMS],
                "requestBody": {
                    "required": True,
                    "content": json_content({"$ref": "#/components/schemas/EmbeddingsRequest"}),
                },
                "responses": {
                    "200": {
                        **ok_infer,
                        "content": json_content(
                            {"$ref": "#/components/schemas/EmbeddingsResponse"}
                        ),
                    },
                    **error_responses(INFER_ERRORS, "OpenAIError"),
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
                "parameters": [*DEADLINE_PARAMS, *CLASS_PARAMS],
                "requestBody": {
                    "required": True,
                    "content": json_content(
                        {"$ref": "#/components/schemas/InfinityEmbeddingsRequest"}
                    ),
                },
                "responses": {
                    "200": {
                        **ok_infer,
                        "content": json_content(
                            {"$ref": "#/components/schemas/InfinityEmbeddingsResponse"}
                        ),
                    },
                    **error_responses([*INFER_ERRORS, "wrong_kind"], "InfinityError"),
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
                    "200": ok_response("InfinityModels"),
                    **error_responses(["unauthorized"], "OpenAIError"),
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
                    **error_responses(["unauthorized"], "OpenAIError"),
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
                    **error_responses(["unauthorized", "not_found"], "OpenAIError"),
                },
            }
        },
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
            "get": {
                **simple_op(
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
                **simple_op(
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
                    *DEADLINE_PARAMS,
                    *CLASS_PARAMS,
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
                        **json_content({"$ref": "#/components/schemas/InferRequest"}),
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        },
                    },
                },
                "responses": {
                    "200": {
                        **ok_infer,
                        "content": json_content({"$ref": "#/components/schemas/InferResponse"}),
                    },
                    **error_responses(INFER_ERRORS, "KServeError"),
                },
            }
        },
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
    paths.update(operation_paths(model_param, lambda rs: error_responses(rs, "KServeError")))
    served = Served(
        models=tuple(models),
        limits=limits,
        dimensions=tuple(sorted(set(dimensions or []))),
        prompts=tuple(sorted(set(prompts or []))),
    )
    tasks = task_paths(security, ok_infer, served)
    for path, operations in tasks.items():
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
                **inference_schemas(served),
                **operation_schemas(),
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
