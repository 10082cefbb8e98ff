"""The task routes of TEI, Cohere, Jina and Infinity.

Embed, rerank, classify and the rest, each with its body's schema and its errors in the
original's shape.
"""

from __future__ import annotations

from typing import Any

from batchserve.server.ops.openapi.common import (
    CLASS_PARAMS,
    DEADLINE_PARAMS,
    INFER_ERRORS,
    error_responses,
    json_content,
    prompt_schema,
    simple_op,
)

__all__ = ["task_paths"]

#: The task routes: (path, summary, description, tag, error schema).
_TASKS = [
    (
        "/embed",
        "Embed texts (TEI)",
        "`inputs` (a text or a list), `truncate`, `normalize` (default true: unit vectors, "
        "after `dimensions` cut them; false: the model folder's own), `dimensions` (the first "
        "N values), `prompt_name` (one of the folder's prompts; default: its default "
        "prompt). An empty text is embedded (its special tokens alone), as TEI does. An "
        "embedding model.",
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
        "`inputs: {source_sentence, sentences}`: one cosine per sentence; "
        "`parameters.prompt_name`, `parameters.truncate`. An embedding model.",
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

_TASK_ERRORS = [*INFER_ERRORS, "wrong_kind", "empty"]
_COMPUTE_TOKENS = {
    "description": "The tokens the request's inputs took in their passes (after truncation, "
    "a prompt's included), as TEI's header; absent for a model that counts none.",
    "schema": {"type": "integer", "minimum": 0},
}


def _task_bodies(dimensions: list[int], prompts: list[str]) -> dict[str, Any]:
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
    prompt = prompt_schema(prompts, nullable=True)
    embed_parameters = {
        "type": ["object", "null"],
        "description": "TEI's fields, also read here (`truncate`, `normalize`, `dimensions`, "
        "`prompt_name`).",
        "properties": {
            "truncate": flag,
            "normalize": flag,
            "dimensions": dims,
            "prompt_name": prompt,
        },
    }
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
                "prompt_name": prompt,
                "parameters": embed_parameters,
            },
        },
        "/similarity": {
            "type": "object",
            "required": ["inputs"],
            "properties": {"inputs": similarity, "parameters": embed_parameters},
        },
        "/": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "inputs": {"oneOf": [passage, passages, similarity]},
                "parameters": {"type": ["object", "null"]},
            },
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


def task_paths(
    security: dict[str, Any],
    ok_infer: dict[str, Any],
    dimensions: list[int],
    prompts: list[str] | None = None,
) -> dict[str, Any]:
    """The task routes' operations.

    ``security`` and ``ok_infer`` as the inference routes have them; ``dimensions`` the
    embedding sizes served; ``prompts`` the names of the prompts the served models define.
    """
    paths: dict[str, Any] = {}
    bodies = _task_bodies(dimensions, prompts or [])
    for path, summary, description, tag, error in _TASKS:
        paths[path] = {
            "post": {
                "summary": summary,
                "description": description + " A route of another kind of model answers 400 "
                "`wrong_kind`, naming the route to use. Inputs over the model's window are "
                "truncated (counted in `X-Truncated-Inputs`) unless `truncate` is false.",
                "tags": [tag],
                **security,
                "parameters": [*DEADLINE_PARAMS, *CLASS_PARAMS],
                "requestBody": {"required": True, "content": json_content(bodies[path])},
                "responses": {
                    "200": {
                        **ok_infer,
                        "headers": {**ok_infer["headers"], "X-Compute-Tokens": _COMPUTE_TOKENS},
                        "content": json_content({}),
                    },
                    **error_responses(_TASK_ERRORS, error),
                },
            }
        }
    paths["/info"] = {
        "get": simple_op(
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
                **simple_op(summary, description, "TEI", ["malformed", "invalid", "wrong_kind"]),
                "requestBody": {"required": True, "content": json_content(bodies[path])},
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
