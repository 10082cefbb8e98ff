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
    simple_op,
)
from batchserve.server.protocols import bodies
from batchserve.server.protocols.bodies import BODIES
from batchserve.server.protocols.fields import Served

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


def _task_bodies(served: Served) -> dict[str, Any]:
    # The bodies are described once (protocols.bodies); /rerank takes TEI's or Infinity's.
    out = {path: body.schema(served) for path, body in BODIES.items()}
    out["/rerank"] = {
        "oneOf": [bodies.TEI_RERANK.schema(served), bodies.INFINITY_RERANK.schema(served)]
    }
    return out


def task_paths(
    security: dict[str, Any], ok_infer: dict[str, Any], served: Served
) -> dict[str, Any]:
    """The task routes' operations.

    ``security`` and ``ok_infer`` as the inference routes have them; ``served`` what the
    bodies' schemas state of the deployment.
    """
    paths: dict[str, Any] = {}
    schemas = _task_bodies(served)
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
                "requestBody": {"required": True, "content": json_content(schemas[path])},
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
                "requestBody": {"required": True, "content": json_content(schemas[path])},
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
