"""text-embeddings-inference's native API (TEI): its task routes, ``/info`` and ``/health``.

The shapes are TEI's (``router/src/http/types.rs`` and ``server.rs``); the deviations are
listed in the manual (``docs/serving/rerank.md``). Each route is a
:class:`~batchserve.server.protocols.tasks.Task`:

* ``POST /embed``: ``inputs`` (a text or a list), ``truncate``, ``truncation_direction``,
  ``normalize``, ``prompt_name``, ``dimensions`` -> a list of vectors (a single text gets a
  list of one, as TEI answers). ``dimensions`` keeps the first N values; ``normalize``
  (default true) then scales each vector to unit length, as TEI does (after the cut). With
  ``normalize: false`` the vectors are the model's own: unscaled, unless the folder's
  modules end in ``Normalize`` (TEI ignores that module and never normalises then; a
  folder's own modules are what every engine here runs). ``truncate: false`` refuses an
  input over the window (413, naming it and its tokens). An empty text is embedded (its
  special tokens alone), as TEI does. batchserve's ``embedding_type`` (``int8``,
  ``uint8``, ``binary``, ``ubinary``; default ``float``) answers each vector, after the cut
  and scaling, as Cohere's ``embedding_types`` make it (JSON integers), calibrated as
  ``/v2/embed``'s.
* ``POST /rerank``: ``query``, ``texts`` (an empty one is scored), ``raw_scores``,
  ``return_text``, ``truncate`` -> ``[{index, score, text?}]`` sorted by score, highest
  first. A body with ``documents``
  instead of ``texts`` is Jina's and Infinity's shape
  (:mod:`~batchserve.server.protocols.rerankers`), answered in theirs.
* ``POST /predict``: ``inputs`` a text, a pair ``[a, b]``, or a batch ``[[a], [a, b], ...]``;
  ``raw_scores`` -> ``[{score, label}]`` sorted by score (a batch: one such list per input).
* ``POST /similarity``: ``inputs: {source_sentence, sentences}`` -> one cosine per sentence.
* ``POST /embed_sparse``: ``inputs`` (a text or a list), ``truncate``,
  ``truncation_direction``, ``prompt_name`` -> one list of ``{index, value}`` per text: its
  nonzero vocabulary terms, indices ascending (a sparse embedder's row).
* ``POST /``: the route of the model's kind, as TEI routes it, so
  ``huggingface_hub.InferenceClient(model=URL)`` works: an embedder answers
  ``feature_extraction`` (and ``sentence_similarity``, told apart by its ``inputs`` object,
  where TEI needs a ``TASK`` setting), a classifier ``text_classification`` (a list of
  ``{label, score}`` per input, honouring ``parameters.top_k`` and
  ``parameters.function_to_apply``, refusing any parameter of another task), a reranker
  ``/rerank``, a sparse embedder ``/embed_sparse``.

Errors are TEI's ``{"error": message, "error_type": type}``, the type read from the reason
(``overloaded`` for 429, ``unhealthy`` for 503, ``validation`` for 413 and 422, ``empty``
for an empty list, ``backend`` for the rest); the statuses are the server's own table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, assert_never

import numpy as np
import numpy.typing as npt

from batchserve import __version__
from batchserve.models.kinds import (
    ACTIVATIONS,
    CLASSIFIER,
    EMBEDDING,
    MULTIVECTOR,
    RERANKER,
    SPARSE,
    Kind,
    Logits,
    Marked,
    Sparse,
    Tensors,
    Tokens,
    Vector,
    unpack,
)
from batchserve.server.http import json_bytes
from batchserve.server.protocols import bodies
from batchserve.server.protocols.bodies import predict_inputs as parse_predict_inputs
from batchserve.server.protocols.embedding_types import require_calibration, typed
from batchserve.server.protocols.fields import (
    check_text,
    optional_bool,
    optional_int,
    require_object,
)
from batchserve.server.protocols.long_inputs import cut_over_chars, long_inputs
from batchserve.server.protocols.maxsim import maxsim_task
from batchserve.server.protocols.tasks import Task, TaskRequest, by_score, scores
from batchserve.server.statuses import ApiError

if TYPE_CHECKING:
    from batchserve.models.loader import LoadedModel
    from batchserve.models.spare_tokenizer import SpareTokenizer
    from batchserve.server.registry import ServedModel
    from batchserve.server.settings import RequestLimits

__all__ = [
    "EMBED",
    "EMBED_SPARSE",
    "EMBED_ALL",
    "MAXSIM_RERANK",
    "PREDICT",
    "RERANK",
    "ROOT_CLASSIFY",
    "SIMILARITY",
    "Tokenizing",
    "choose_root",
    "error_body",
    "error_type",
    "info",
    "parse_predict_inputs",
    "sparse_terms",
    "truncate_vector",
]

_ERROR_TYPES = {
    "queue_full": "overloaded",
    "infeasible": "overloaded",
    "draining": "unhealthy",
    "not_ready": "unhealthy",
    "invalid": "validation",
    "malformed": "validation",
    "too_large": "validation",
    "unsupported_media_type": "validation",
    "empty": "empty",
}


def error_type(reason: str) -> str:
    """TEI's ``error_type`` for one of the server's reasons."""
    return _ERROR_TYPES.get(reason, "backend")


def error_body(error: ApiError) -> bytes:
    """TEI's error shape: ``{"error": message, "error_type": type}``."""
    return json_bytes({"error": error.message, "error_type": error_type(error.reason)})


def _truncate(data: dict[str, Any], params: dict[str, Any]) -> bool:
    direction = params.get("truncation_direction", data.get("truncation_direction"))
    if direction not in (None, "Right", "right"):
        raise ApiError(
            "invalid",
            f"truncation_direction must be 'Right' (left truncation is not offered), "
            f"got {direction!r}",
            param="truncation_direction",
        )
    merged = {**data, **params}
    return optional_bool(merged, "truncate", True)


def _params(data: dict[str, Any]) -> dict[str, Any]:
    params = data.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ApiError("invalid", "parameters must be an object", param="parameters")
    return params


# -- /embed -------------------------------------------------------------------------------


def _parse_embed(data: Any, limits: RequestLimits) -> TaskRequest:
    # An empty text is embedded, as TEI does: Haystack's TEI embedders send
    # ``doc.content or ""``, and one empty document must not fail a batch of them.
    if isinstance(data, dict) and _truncating(data):
        # Truncation on: a text over --max-input-chars is cut, not refused (TEI's #394).
        inputs = data.get("inputs")
        cut = cut_over_chars(inputs, limits)
        if cut is not inputs:
            data = {**data, "inputs": cut}
    body = bodies.EMBED.read(data, limits)
    merged = {**body, **(body["parameters"] or {})}
    return TaskRequest(
        model=body["model"],
        items=body["inputs"],
        truncate=merged["truncate"],
        options={
            "dimensions": merged["dimensions"],
            "normalize": merged["normalize"],
            "prompt_name": merged["prompt_name"],
            "long_inputs": long_inputs(body["long_inputs"]),
            "embedding_type": body["embedding_type"],
        },
    )


def _truncating(data: dict[str, Any]) -> bool:
    # Whether the body leaves truncation on (what its rules will read, looked at first).
    split = data.get("long_inputs")
    if isinstance(split, dict) and split.get("split") is True:
        return False
    params = data.get("parameters")
    flag = params.get("truncate") if isinstance(params, dict) else None
    return (data.get("truncate") if flag is None else flag) is not False


def _prepare_embed(model: ServedModel, req: TaskRequest) -> None:
    # int8/uint8 need the model's calibration: refused before anything is queued.
    loaded = model.loaded
    assert loaded is not None
    require_calibration(loaded, (req.options["embedding_type"],), "embedding_type")


def truncate_vector(
    vector: Any,
    dimensions: int | None,
    size: int | None,
    *,
    normalize: bool = True,
    unit: bool = True,
) -> list[float]:
    """``vector`` cut to its first ``dimensions`` values, then scaled to unit length if asked.

    Args:
        vector: the model's vector.
        dimensions: the values to keep (None: all).
        size: the model's dimension, as an error names it.
        normalize: scale the result to unit length (TEI's ``normalize``).
        unit: ``vector`` is unit length already (the model normalises): a whole one is
            left as it is.

    Raises:
        ApiError: ``invalid`` when ``dimensions`` is over the model's ``size``.
    """
    arr = np.asarray(vector, dtype=np.float32).reshape(-1)
    if dimensions is not None and dimensions > arr.size:
        raise ApiError(
            "invalid",
            f"dimensions must be at most the model's {size or arr.size}, got {dimensions}",
            param="dimensions",
        )
    whole = dimensions is None or dimensions == arr.size
    cut = arr if whole else arr[:dimensions]
    if normalize and not (whole and unit):
        norm = float(np.linalg.norm(cut))
        if norm > 0:
            cut = cut / norm
    return [float(v) for v in cut]


def check_dimensions(requested: int | None, size: int | None) -> None:
    """Refuse at parse time a ``dimensions`` over the model's size.

    Raises:
        ApiError: ``invalid`` naming the model's size.
    """
    if requested is not None and size is not None and requested > size:
        raise ApiError(
            "invalid",
            f"dimensions must be at most the model's {size}, got {requested}",
            param="dimensions",
        )


def _answer_embed(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    loaded = model.loaded
    assert loaded is not None
    size = loaded.dimension
    dims = req.options["dimensions"]
    check_dimensions(dims, size)
    normalize = req.options["normalize"]
    unit = loaded.normalized is True  # not known (None): scaled when asked
    vectors = [truncate_vector(v, dims, size, normalize=normalize, unit=unit) for v in outputs]
    precision = req.options["embedding_type"]
    if precision == "float":
        return json_bytes(vectors)

    def transform(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        # the same cut and scale, on the calibration embeddings
        cut = [truncate_vector(v, dims, size, normalize=normalize, unit=unit) for v in rows]
        return np.asarray(cut, dtype=np.float32)

    rows = np.asarray(vectors, dtype=np.float32).reshape(len(vectors), -1)
    key = ("tei", dims, normalize, unit)
    return json_bytes(typed(loaded, rows, precision, key=key, transform=transform).tolist())


EMBED = Task(
    route="POST /embed",
    kinds=(EMBEDDING,),
    parse=_parse_embed,
    answer=_answer_embed,
    field="inputs",
    prepare=_prepare_embed,
)


# -- /embed_sparse ------------------------------------------------------------------------


def _parse_embed_sparse(data: Any, limits: RequestLimits) -> TaskRequest:
    body = bodies.EMBED_SPARSE.read(data, limits)
    return TaskRequest(
        model=body["model"],
        items=body["inputs"],
        truncate=body["truncate"],
        options={"prompt_name": body["prompt_name"]},
    )


def sparse_terms(row: Any) -> list[dict[str, Any]]:
    """A sparse row's nonzero terms, TEI's ``[{index, value}]``, indices ascending."""
    values = np.asarray(row, dtype=np.float32).reshape(-1)
    where = np.flatnonzero(values)
    return [
        {"index": i, "value": v}
        for i, v in zip(where.tolist(), values[where].tolist(), strict=True)
    ]


def _answer_embed_sparse(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    return json_bytes([sparse_terms(row) for row in outputs])


EMBED_SPARSE = Task(
    route="POST /embed_sparse",
    kinds=(SPARSE,),
    parse=_parse_embed_sparse,
    answer=_answer_embed_sparse,
    field="inputs",
)


# -- /embed_all ---------------------------------------------------------------------------


def _parse_embed_all(data: Any, limits: RequestLimits) -> TaskRequest:
    body = bodies.EMBED_ALL.read(data, limits)
    query = body["is_query"]
    return TaskRequest(
        model=body["model"],
        items=[Marked(text, query) for text in body["inputs"]],
        truncate=body["truncate"],
    )


def _answer_embed_all(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    return json_bytes([unpack(row).tolist() for row in outputs])


EMBED_ALL = Task(
    route="POST /embed_all",
    kinds=(MULTIVECTOR,),
    parse=_parse_embed_all,
    answer=_answer_embed_all,
    field="inputs",
)


# -- /rerank ------------------------------------------------------------------------------


def _parse_rerank(data: Any, limits: RequestLimits) -> TaskRequest:
    body = bodies.TEI_RERANK.read(data, limits)
    query = body["query"]
    return TaskRequest(
        model=None,
        items=[(query, t) for t in body["texts"]],
        truncate=body["truncate"],
        options={"raw_scores": body["raw_scores"], "return_text": body["return_text"]},
    )


def _answer_rerank(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    loaded = model.loaded
    assert loaded is not None
    ranks = []
    for i, row in enumerate(scores(outputs, loaded.kind.scoring(req.options["raw_scores"]))):
        rank: dict[str, Any] = {"index": i, "score": row[0]}
        if req.options["return_text"]:
            rank["text"] = req.items[i][1]
        ranks.append(rank)
    ranks.sort(key=lambda r: -r["score"])
    return json_bytes(ranks)


RERANK = Task(
    route="POST /rerank",
    kinds=(RERANKER,),
    parse=_parse_rerank,
    answer=_answer_rerank,
    field="texts",
)
#: ``POST /rerank`` answered by a multi-vector model: MaxSim scores.
MAXSIM_RERANK = maxsim_task(RERANK)


# -- /predict -----------------------------------------------------------------------------


def _parse_predict(data: Any, limits: RequestLimits) -> TaskRequest:
    body = bodies.PREDICT.read(data, limits)
    items, single = body["inputs"]
    return TaskRequest(
        model=None,
        items=items,
        truncate=body["truncate"],
        options={"raw_scores": body["raw_scores"], "single": single},
    )


def _predictions(labels: tuple[str, ...], row: list[float]) -> list[dict[str, Any]]:
    out = [{"score": s, "label": label} for s, label in zip(row, labels, strict=True)]
    out.sort(key=by_score)
    return out


def _answer_predict(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    loaded = model.loaded
    assert loaded is not None
    rows = scores(outputs, loaded.kind.scoring(req.options["raw_scores"]))
    answers = [_predictions(loaded.labels, row) for row in rows]
    return json_bytes(answers[0] if req.options["single"] else answers)


#: A classifier's route first: a body that names no model goes to the classifier of a
#: server that also serves a reranker (``InferenceClient.text_classification``).
PREDICT = Task(
    route="POST /predict",
    kinds=(CLASSIFIER, RERANKER),
    parse=_parse_predict,
    answer=_answer_predict,
    field="inputs",
)


# -- POST / for a classifier: Hugging Face's text-classification shape --------------------


#: The parameters of Hugging Face's text classification, and TEI's truncation.
_CLASSIFY_PARAMETERS = ("top_k", "function_to_apply", "truncate", "truncation_direction")


def _parse_root_classify(data: Any, limits: RequestLimits) -> TaskRequest:
    data = require_object(data)
    params = _params(data)
    for key in params:
        if key not in _CLASSIFY_PARAMETERS:
            # huggingface_hub's other tasks post here too (zero_shot_classification sends
            # candidate_labels): answering them as text classification would lose them.
            raise ApiError(
                "invalid",
                f"parameters.{key} is not a parameter of text classification, which is "
                f"what this model answers at POST / (it takes {', '.join(_CLASSIFY_PARAMETERS)})",
                param=f"parameters.{key}",
            )
    value = data.get("inputs")
    if isinstance(value, str):
        items = [check_text(value, "inputs", limits)]
    else:
        items, _ = parse_predict_inputs(value, limits)
    fn = params.get("function_to_apply")
    if fn not in (None, "sigmoid", "softmax", "none"):
        raise ApiError(
            "invalid",
            f"function_to_apply must be 'sigmoid', 'softmax' or 'none', got {fn!r}",
            param="parameters.function_to_apply",
        )
    top_k = optional_int(params, "top_k")
    return TaskRequest(
        model=None,
        items=items,
        truncate=_truncate(data, params),
        options={"function": fn, "top_k": top_k},
    )


def _answer_root_classify(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    loaded = model.loaded
    assert loaded is not None
    fn = req.options["function"]
    top_k = req.options["top_k"]
    answers = []
    activation = loaded.kind.activation if fn is None else ACTIVATIONS[fn]
    for row in scores(outputs, activation):
        preds = [{"label": label, "score": s} for label, s in zip(loaded.labels, row, strict=True)]
        preds.sort(key=by_score)
        answers.append(preds[:top_k] if top_k is not None else preds)
    return json_bytes(answers)


ROOT_CLASSIFY = Task(
    route="POST /",
    kinds=(CLASSIFIER,),
    parse=_parse_root_classify,
    answer=_answer_root_classify,
    field="inputs",
)


# -- /similarity --------------------------------------------------------------------------


def _parse_similarity(data: Any, limits: RequestLimits) -> TaskRequest:
    body = bodies.SIMILARITY.read(data, limits)
    inputs = body["inputs"]
    params = body["parameters"] or {}
    return TaskRequest(
        model=None,
        items=[inputs["source_sentence"], *inputs["sentences"]],
        truncate=params.get("truncate", body["truncate"]),
        options={"prompt_name": params.get("prompt_name")},
    )


def _answer_similarity(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    vectors = np.asarray(outputs, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1)
    norms[norms == 0] = 1.0
    unit = vectors / norms[:, None]
    return json_bytes([float(v) for v in unit[1:] @ unit[0]])


SIMILARITY = Task(
    route="POST /similarity",
    kinds=(EMBEDDING,),
    parse=_parse_similarity,
    answer=_answer_similarity,
)


def choose_root(data: Any, kind: Kind) -> Task:
    """The task ``POST /`` runs for a model of ``kind`` (and, for an embedder, the body).

    As TEI routes it by its model's type: logits over a pair rank (``/rerank``), logits
    over a text classify (Hugging Face's text classification); a vector is embedded, or
    compared (``sentence_similarity``, told apart by its ``inputs`` object). A model with
    no head the server knows is sent to ``/embed``, which names the route to use.
    """
    match kind.head:
        case Logits():
            return RERANK if kind.item == "pair" else ROOT_CLASSIFY
        case Sparse():
            return EMBED_SPARSE
        case Tokens():
            return EMBED_ALL
        case Vector() | Tensors():
            if isinstance(data, dict) and isinstance(data.get("inputs"), dict):
                return SIMILARITY
            return EMBED
        case _:
            assert_never(kind.head)


# -- GET /info ----------------------------------------------------------------------------


#: TEI's names for the pooling modes it shares with sentence-transformers.
_TEI_POOLING = {"lasttoken": "last_token"}


def info(model: ServedModel, limits: RequestLimits) -> dict[str, Any]:
    """TEI's ``/info`` for ``model``.

    ``model_type.embedding.pooling`` is the folder's own pooling (TEI's ``cls``, ``mean``,
    ``last_token``; sentence-transformers' ``max``, ``weightedmean``,
    ``mean_sqrt_len_tokens`` by their names; ``mean`` for a model that states none) and
    ``max_input_length`` its window.
    """
    loaded = model.loaded
    kind = loaded.kind if loaded is not None else EMBEDDING
    labels = loaded.labels if loaded is not None else ()
    model_type: dict[str, Any]
    # TEI's model types are named as the kinds are; a model with no head TEI knows is
    # described as an embedder, as one still loading is.
    match kind.head:
        case Logits():
            model_type = {
                kind.name: {
                    "id2label": {str(i): label for i, label in enumerate(labels)},
                    "label2id": {label: i for i, label in enumerate(labels)},
                }
            }
        case Sparse():
            model_type = {EMBEDDING.name: {"pooling": "splade"}}  # as TEI describes SPLADE
        case Tokens():
            # TEI describes a model that answers /embed_all as an embedder with no pooling.
            model_type = {EMBEDDING.name: {"pooling": "none"}}
        case Vector() | Tensors():
            pooling = (loaded.pooling if loaded is not None else None) or "mean"
            # TEI spells last-token pooling ``last_token``; the other modes keep their names.
            model_type = {EMBEDDING.name: {"pooling": _TEI_POOLING.get(pooling, pooling)}}
        case _:
            assert_never(kind.head)
    engine = (loaded.engine if loaded is not None else None) or {}
    config = model.config
    return {
        "model_id": model.name,
        "model_sha": None,
        "model_dtype": engine.get("precision", "float32"),
        "served_model_name": model.name,
        "model_type": model_type,
        "max_concurrent_requests": config.queue_size,
        "max_input_length": loaded.max_input_tokens if loaded is not None else None,
        "max_batch_tokens": config.max_batch_tokens,
        "max_batch_requests": config.max_batch_size,
        "max_client_batch_size": min(limits.max_inputs, config.queue_size),
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": __version__,
        "sha": None,
        "docker_label": None,
        "kind": kind.name,
    }


# -- POST /tokenize and /decode: not batched (no forward pass) -----------------------------


class Tokenizing:
    """``/tokenize`` and ``/decode`` on a model's spare tokenizer (never its passes' own).

    Args:
        spare: the model's copy (:class:`~batchserve.models.spare_tokenizer.SpareTokenizer`).
    """

    def __init__(self, spare: SpareTokenizer) -> None:
        self._spare = spare

    @classmethod
    def of(cls, loaded: LoadedModel) -> Tokenizing | None:
        """The tokenizer of a model's engine (torch, ONNX, OpenVINO); None off an engine."""
        spare = loaded.spare_tokenizer
        return cls(spare) if spare is not None else None

    def tokenize(self, data: Any, limits: RequestLimits) -> list[list[dict[str, Any]]]:
        """TEI's ``/tokenize``: one list of ``{id, text, special, start, stop}`` per input.

        Raises:
            ApiError: the body breaks a rule (naming the field).
        """
        body = bodies.TOKENIZE.read(data, limits)
        items = body["inputs"]
        special = body["add_special_tokens"]
        out = []
        with self._spare.held() as tokenizer:
            for item in items:
                pair = (item,) if isinstance(item, str) else item
                enc = tokenizer(*pair, add_special_tokens=special, return_offsets_mapping=True)
                ids = enc["input_ids"]
                tokens = tokenizer.convert_ids_to_tokens(ids)
                mask = tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
                row = []
                for tid, tok, (start, stop), is_special in zip(
                    ids, tokens, enc["offset_mapping"], mask, strict=True
                ):
                    row.append(
                        {
                            "id": tid,
                            "text": tok,
                            "special": bool(is_special),
                            "start": None if is_special else start,
                            "stop": None if is_special else stop,
                        }
                    )
                out.append(row)
        return out

    def decode(self, data: Any, limits: RequestLimits) -> list[str]:
        """TEI's ``/decode``: ``ids`` (a list, or a list of lists) to texts.

        Raises:
            ApiError: ``ids`` is not a list of integers (or of lists of them).
        """
        body = bodies.DECODE.read(data, limits)
        batch, skip = body["ids"], body["skip_special_tokens"]
        with self._spare.held() as tokenizer:
            return [tokenizer.decode(row, skip_special_tokens=skip) for row in batch]
