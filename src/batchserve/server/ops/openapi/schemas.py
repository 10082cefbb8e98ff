"""The request and answer schemas of the inference routes.

OpenAI's embeddings, KServe v2's tensors, every protocol's error body, Infinity's
embeddings and model list.
"""

from __future__ import annotations

from typing import Any

from batchserve.models.kinds import KINDS
from batchserve.server.protocols.bodies import INFER, INFINITY_EMBEDDINGS, OPENAI_EMBEDDINGS
from batchserve.server.protocols.fields import Served
from batchserve.server.protocols.tensors import DTYPES, MAX_DIMS
from batchserve.server.statuses import STATUS_TABLE

__all__ = ["inference_schemas"]

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


def inference_schemas(served: Served) -> dict[str, Any]:
    """The components the inference routes refer to, for what is ``served``."""
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
        "EmbeddingsRequest": OPENAI_EMBEDDINGS.schema(served),
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
        "InferRequest": INFER.schema(served),
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
    schemas.update(_infinity_schemas(schemas, served))
    return schemas


def _infinity_schemas(schemas: dict[str, Any], served: Served) -> dict[str, Any]:
    """Infinity's ``/embeddings`` (OpenAI's shape, with its differences) and ``/models``."""
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
        "InfinityEmbeddingsRequest": INFINITY_EMBEDDINGS.schema(served),
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
