"""Rerank and classify in Cohere's, Jina's and Infinity's shapes.

Each route is a :class:`~batchserve.server.protocols.tasks.Task` (one query and N documents
are N pairs, batched with everyone's). The shapes follow the originals' source (cohere-python
``v2/raw_client.py`` and ``raw_base_client.py``; Infinity's ``fastapi_schemas/pymodels.py``;
Jina's reranker API as the Cohere-style clients call it); the manual lists the deviations.

* ``POST /v2/rerank`` (Cohere v2): ``model``, ``query``, ``documents`` (strings),
  ``top_n``, ``max_tokens_per_doc`` -> ``{id, results: [{index, relevance_score}], meta}``.
* ``POST /v1/rerank`` (Cohere v1 and Jina, one request shape): ``documents`` are strings or
  objects of strings (their ``text``, or with ``rank_fields`` those fields as ``key: value``
  lines, as Cohere ranks them); ``top_n``, ``return_documents`` (default true, as Jina's)
  -> ``{id, model, results: [{index, relevance_score, document}], usage, meta}``, each
  document as sent (a string as ``{text}``): the fields of both answers, so each client
  finds its own.
* ``POST /rerank`` with ``documents`` (Infinity): ``query``, ``documents``,
  ``return_documents``, ``raw_scores``, ``top_n`` -> ``{object: "rerank", results:
  [{relevance_score, index, document}], model, usage, id, created}`` (the document a plain
  string, as Infinity writes it). A body with ``texts`` is TEI's
  (:mod:`~batchserve.server.protocols.tei`).
* ``POST /classify`` (Infinity): ``input`` (texts), ``raw_scores`` -> ``{object: "classify",
  data: [[{score, label}, ...]], model, usage, id, created}``.

Results are sorted by score, highest first, and cut to ``top_n``. Scores are the sigmoid of
the reranker's logit (``raw_scores`` where the shape has it). A passage may be empty (the
pipelines send ``content or ""``); the query may not. Errors: ``/v2/rerank`` answers
Cohere's ``{"message": ...}``, ``/v1/rerank`` adds Jina's ``detail``, ``/rerank`` TEI's
``{error, error_type}`` with FastAPI's ``detail`` list (Infinity's 422), and ``/classify``
Infinity's (OpenAI-style) ``{"error": {...}}`` with the same ``detail``.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from batchserve.models.kinds import CLASSIFIER, RERANKER, Kind, Tokens
from batchserve.server.http import json_bytes
from batchserve.server.protocols import bodies, tei
from batchserve.server.protocols.fields import Body, text_list
from batchserve.server.protocols.maxsim import maxsim_task
from batchserve.server.protocols.tasks import Task, TaskRequest, by_score, scores, tokens_of
from batchserve.server.statuses import ApiError

if TYPE_CHECKING:
    from batchserve.server.registry import ServedModel
    from batchserve.server.settings import RequestLimits

__all__ = [
    "CLASSIFY",
    "COHERE_V1_RERANK",
    "COHERE_V2_RERANK",
    "INFINITY_RERANK",
    "choose_cohere_v1",
    "choose_cohere_v2",
    "choose_rerank",
    "cohere_error_body",
    "cohere_jina_error_body",
    "fastapi_detail",
    "infinity_error_body",
    "rerank_error_body",
]


def cohere_error_body(error: ApiError) -> bytes:
    """Cohere's error shape: ``{"message": ...}``."""
    return json_bytes({"message": error.message})


def cohere_jina_error_body(error: ApiError) -> bytes:
    """``POST /v1/rerank``'s errors: Cohere's ``message`` and Jina's ``detail``.

    Jina's clients (LangChain's ``JinaRerank``, LlamaIndex's, Haystack's ``JinaRanker``)
    raise ``RuntimeError(body["detail"])`` for any answer without ``results``; without the
    field they fail on a ``KeyError`` that hides the message.
    """
    return json_bytes({"message": error.message, "detail": error.message})


def fastapi_detail(error: ApiError) -> list[dict[str, Any]]:
    """FastAPI's validation error list for ``error``: ``[{loc, msg, type}]``.

    What Infinity answers a 422 with, and what its generated client parses then.
    """
    return [{"loc": ["body", error.param or "body"], "msg": error.message, "type": error.reason}]


def rerank_error_body(error: ApiError) -> bytes:
    """``POST /rerank``'s errors: TEI's ``{error, error_type}`` and FastAPI's ``detail``.

    The path is TEI's and Infinity's: TEI's clients read ``error``; Infinity's generated
    client parses a 422 as FastAPI's ``{"detail": [{loc, msg, type}]}``, and the Jina
    clients pointed at an Infinity-style URL read ``detail``.
    """
    return json_bytes(
        {
            "error": error.message,
            "error_type": tei.error_type(error.reason),
            "detail": fastapi_detail(error),
        }
    )


def infinity_error_body(error: ApiError) -> bytes:
    """Infinity's errors: its (OpenAI-style) ``error`` object and FastAPI's ``detail``.

    Infinity answers its own errors (a model it does not serve, overload) with ``error``
    and a request that fails validation with FastAPI's 422 ``detail``; its generated
    client parses the latter on a 422. Both are sent, so either reader finds its field.
    """
    return json_bytes(
        {
            "error": {
                "message": error.message,
                "type": error.reason,
                "param": error.param,
                "code": error.status,
            },
            "detail": fastapi_detail(error),
        }
    )


def _documents(
    value: Any, limits: RequestLimits, *, objects: bool, rank_fields: list[str] | None
) -> tuple[list[str], list[Any]]:
    """The texts to score, and the documents as sent (what ``return_documents`` returns).

    A document is a string or, where the shape takes ``objects`` (Cohere's and Jina's), an
    object of strings: its ``text``, or with ``rank_fields`` those fields as ``key: value``
    lines in that order (how Cohere ranks semi-structured documents).
    """
    if not objects or not isinstance(value, list):
        texts = text_list(value, "documents", limits, allow_empty=True)
        return texts, texts
    texts = text_list(
        [_document_text(d, i, rank_fields) for i, d in enumerate(value)],
        "documents",
        limits,
        allow_empty=True,
    )
    return texts, value


def _document_text(document: Any, i: int, rank_fields: list[str] | None) -> Any:
    if not isinstance(document, dict):
        return document  # a string, or refused by text_list naming its type
    where = f"documents[{i}]"
    for key, v in document.items():
        if not isinstance(v, str):
            raise ApiError(
                "invalid",
                f"{where}.{key} must be a string, got {type(v).__name__}",
                param=f"{where}.{key}",
            )
    if rank_fields is None:
        if "text" not in document:
            raise ApiError(
                "invalid",
                f"{where} must be a string or an object with a 'text' field (or name the "
                f"fields to rank in rank_fields), got the fields {sorted(document)}",
                param=where,
            )
        return document["text"]
    lines = [f"{key}: {document[key]}" for key in rank_fields if key in document]
    if not lines:
        raise ApiError(
            "invalid",
            f"{where} has none of the rank_fields {rank_fields}, got the fields {sorted(document)}",
            param=where,
        )
    return "\n".join(lines)


def _parse(data: Any, limits: RequestLimits, body: Body) -> TaskRequest:
    fields = body.read(data, limits)
    query = fields["query"]
    texts, documents = _documents(
        fields["documents"],
        limits,
        objects="rank_fields" in fields,  # where rank_fields are taken, so are objects
        rank_fields=fields.get("rank_fields"),
    )
    return TaskRequest(
        model=fields["model"],
        items=[(query, t) for t in texts],
        options={
            "top_n": fields["top_n"],
            "return_documents": fields["return_documents"],
            "raw_scores": fields["raw_scores"],
            "documents": documents,
        },
    )


def _ranked(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> list[tuple[int, float]]:
    loaded = model.loaded
    assert loaded is not None
    rows = scores(outputs, loaded.kind.scoring(req.options["raw_scores"]))
    scored = [(i, row[0]) for i, row in enumerate(rows)]
    scored.sort(key=lambda p: -p[1])
    top_n = req.options["top_n"]
    return scored[:top_n] if top_n is not None else scored


def _meta(version: str) -> dict[str, Any]:
    return {"api_version": {"version": version}, "billed_units": {"search_units": 1}}


def _answer_v2(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    results = [{"index": i, "relevance_score": s} for i, s in _ranked(model, req, outputs)]
    return json_bytes({"id": str(uuid.uuid4()), "results": results, "meta": _meta("2")})


def _answer_v1(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    results = []
    for i, s in _ranked(model, req, outputs):
        result: dict[str, Any] = {"index": i, "relevance_score": s}
        if req.options["return_documents"]:
            document = req.options["documents"][i]
            # Cohere returns the document as sent: a string as {text}, an object whole.
            result["document"] = document if isinstance(document, dict) else {"text": document}
        results.append(result)
    tokens = tokens_of(model, req.items)
    return json_bytes(
        {
            "id": str(uuid.uuid4()),
            "model": model.name,
            "results": results,
            "usage": {"total_tokens": tokens, "prompt_tokens": tokens},
            "meta": _meta("1"),
        }
    )


def _answer_infinity(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    results = [
        {
            "relevance_score": s,
            "index": i,
            "document": req.items[i][1] if req.options["return_documents"] else None,
        }
        for i, s in _ranked(model, req, outputs)
    ]
    tokens = tokens_of(model, req.items)
    return json_bytes(
        {
            "object": "rerank",
            "results": results,
            "model": model.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "id": f"infinity-{uuid.uuid4()}",
            "created": int(time.time()),
        }
    )


_RERANKERS = (RERANKER,)

COHERE_V2_RERANK = Task(
    route="POST /v2/rerank",
    kinds=_RERANKERS,
    parse=lambda data, limits: _parse(data, limits, bodies.COHERE_V2_RERANK),
    answer=_answer_v2,
)
COHERE_V1_RERANK = Task(
    route="POST /v1/rerank",
    kinds=_RERANKERS,
    parse=lambda data, limits: _parse(data, limits, bodies.COHERE_V1_RERANK),
    answer=_answer_v1,
)
INFINITY_RERANK = Task(
    route="POST /rerank",
    kinds=_RERANKERS,
    parse=lambda data, limits: _parse(data, limits, bodies.INFINITY_RERANK),
    answer=_answer_infinity,
)


# The same routes answered by a multi-vector (ColBERT) model: MaxSim scores.
_MAXSIM_V2 = maxsim_task(COHERE_V2_RERANK)
_MAXSIM_V1 = maxsim_task(COHERE_V1_RERANK)
_MAXSIM_INFINITY = maxsim_task(INFINITY_RERANK)


def choose_rerank(data: Any, kind: Kind) -> Task:
    """``POST /rerank``: TEI's shape (``texts``), or Infinity's (``documents``).

    A multi-vector model answers either from MaxSim scores.
    """
    tokens = isinstance(kind.head, Tokens)
    if isinstance(data, dict) and "documents" in data and "texts" not in data:
        return _MAXSIM_INFINITY if tokens else INFINITY_RERANK
    return tei.MAXSIM_RERANK if tokens else tei.RERANK


def choose_cohere_v2(data: Any, kind: Kind) -> Task:
    """``POST /v2/rerank``: a reranker's scores, or a multi-vector model's MaxSim."""
    return _MAXSIM_V2 if isinstance(kind.head, Tokens) else COHERE_V2_RERANK


def choose_cohere_v1(data: Any, kind: Kind) -> Task:
    """``POST /v1/rerank``: a reranker's scores, or a multi-vector model's MaxSim."""
    return _MAXSIM_V1 if isinstance(kind.head, Tokens) else COHERE_V1_RERANK


# -- /classify ----------------------------------------------------------------------------


def _parse_classify(data: Any, limits: RequestLimits) -> TaskRequest:
    body = bodies.CLASSIFY.read(data, limits)
    return TaskRequest(
        model=body["model"], items=body["input"], options={"raw_scores": body["raw_scores"]}
    )


def _answer_classify(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    loaded = model.loaded
    assert loaded is not None
    data = []
    for row in scores(outputs, loaded.kind.scoring(req.options["raw_scores"])):
        preds = [{"score": s, "label": label} for s, label in zip(row, loaded.labels, strict=True)]
        preds.sort(key=by_score)
        data.append(preds)
    tokens = tokens_of(model, req.items)
    return json_bytes(
        {
            "object": "classify",
            "data": data,
            "model": model.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "id": f"infinity-{uuid.uuid4()}",
            "created": int(time.time()),
        }
    )


CLASSIFY = Task(
    route="POST /classify",
    kinds=(CLASSIFIER,),
    parse=_parse_classify,
    answer=_answer_classify,
)
