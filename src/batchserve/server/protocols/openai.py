"""The OpenAI embeddings protocol: ``POST /v1/embeddings`` and ``GET /v1/models``.

Parsing (:func:`parse_embeddings_request`) checks every field as the body's description
states it (:data:`~batchserve.server.protocols.bodies.OPENAI_EMBEDDINGS`) and names the one
that breaks a rule; nothing is queued for a request that fails it. ``input`` is a string or
a list of strings (token arrays are refused: this server tokenizes itself); ``encoding_format`` is
``float`` (JSON numbers) or ``base64`` (little-endian float32 bytes, what the official
client asks for by default); ``dimensions`` shortens each vector to its first N values and,
unless the model's vectors are not unit length, scales it back to unit length (what
Matryoshka-trained models are for, and what OpenAI's ``text-embedding-3`` models do); a
value above the model's own dimension is refused, and so is one the model does not declare
it was trained for, unless the operator allows any
(:mod:`~batchserve.server.protocols.dimensions`). batchserve's ``embedding_type``
(``int8``, ``uint8``, ``binary``, ``ubinary``; default ``float``) answers each vector as
Cohere's ``embedding_types`` make it, as JSON integers (with ``encoding_format: float``:
a client decodes base64 as float32), calibrated as ``/v2/embed``'s
(:mod:`~batchserve.server.protocols.embedding_types`).

The vectors are what the model folder's own modules return (unit length when they end in
``Normalize``); the folder's default prompt is prepended to each text, as
``SentenceTransformer.encode`` does. ``usage`` counts the tokens each text took in its pass
(the prompt's included, after truncation to the model's window), and ``X-Truncated-Inputs``
says how many texts were cut (:mod:`~batchserve.server.protocols.window`).

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with the
server's reason as ``code`` (see :mod:`batchserve.server.statuses`).

:class:`EmbeddingsEndpoint` is the protocol's part of an inference exchange
(:mod:`batchserve.server.exchange`): the body's model, its texts, and the answer. Infinity's
``/embeddings`` is the same endpoint with Infinity's differences
(:mod:`~batchserve.server.protocols.infinity`).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from batchserve.batcher import Served
from batchserve.models.kinds import EMBEDDING, Kind, apply_prompt, wrong_kind
from batchserve.server.exchange import Exchange, Parsed, ParseError, Reply, timing_head
from batchserve.server.http import json_bytes, load_json
from batchserve.server.protocols.bodies import OPENAI_EMBEDDINGS
from batchserve.server.protocols.dimensions import check_declared_dimensions
from batchserve.server.protocols.embedding_types import Transform, require_calibration, typed
from batchserve.server.protocols.fields import Body
from batchserve.server.protocols.long_inputs import (
    LongInputs,
    Windows,
    check_queue,
    cut_over_chars,
    long_inputs,
    split_windows,
)
from batchserve.server.protocols.window import token_counts, truncated
from batchserve.server.registry import Registry, ServedModel
from batchserve.server.settings import RequestLimits
from batchserve.server.statuses import ApiError

__all__ = [
    "EmbeddingsEndpoint",
    "EmbeddingsRequest",
    "check_dimensions",
    "embeddings_request",
    "embeddings_response",
    "error_body",
    "model_entry",
    "models_response",
    "parse_embeddings_request",
    "shorten",
    "shortened",
]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}
_CREATED = int(time.time())


@dataclass(slots=True, kw_only=True)
class EmbeddingsRequest:
    """A checked ``POST /v1/embeddings`` body (one per request: not frozen, for speed).

    Attributes:
        model: the requested model name (None: the default model).
        texts: the inputs, in order.
        encoding_format: ``float`` or ``base64``.
        dimensions: the requested dimension, if any.
        long_inputs: what to do with inputs over the window (None: truncate them).
        windows: the items that run, where inputs were split into windows (None: the texts).
        embedding_type: batchserve's ``embedding_type``: ``float``, or a quantized type
            (:mod:`~batchserve.server.protocols.embedding_types`).
    """

    model: str | None
    texts: list[str]
    encoding_format: str
    dimensions: int | None
    long_inputs: LongInputs | None = None
    windows: Windows | None = None
    embedding_type: str = "float"


def parse_embeddings_request(body: bytes, limits: RequestLimits) -> EmbeddingsRequest:
    """Parse and check an embeddings request body.

    Raises:
        ApiError: ``malformed`` (not JSON), ``invalid`` (a field breaks a rule) or
            ``too_large`` (too many inputs, a text too long); the message names the field.
    """
    return embeddings_request(load_json(body), limits, long=len(body) > limits.max_input_chars)


def embeddings_request(
    data: Any, limits: RequestLimits, *, body: Body = OPENAI_EMBEDDINGS, long: bool = True
) -> EmbeddingsRequest:
    """Check an embeddings request's JSON (see :func:`parse_embeddings_request`).

    Args:
        data: the body's JSON.
        limits: the request limits.
        body: the body's description (Infinity's differs: empty texts, ``dimensions: 0``).
        long: the body may hold a text over ``--max-input-chars`` (False: its bytes are
            fewer, so no text is looked at for it).

    Raises:
        ApiError: ``invalid`` or ``too_large``, naming the field.
    """
    if long and isinstance(data, dict) and not _splits(data.get("long_inputs")):
        # Truncation on: a text over --max-input-chars is cut, not refused (the model cuts it).
        texts = data.get("input")
        cut = cut_over_chars(texts, limits)
        if cut is not texts:
            data = {**data, "input": cut}
    fields = body.read(data, limits)
    return EmbeddingsRequest(
        model=fields["model"],
        texts=fields["input"],
        encoding_format=fields["encoding_format"],
        dimensions=fields["dimensions"],
        long_inputs=long_inputs(fields["long_inputs"]),
        embedding_type=fields.get("embedding_type", "float"),  # Infinity's body has none
    )


def _splits(value: Any) -> bool:
    return isinstance(value, dict) and value.get("split") is True


def check_dimensions(requested: int | None, dimension: int | None) -> None:
    """Refuse a ``dimensions`` above the model's own.

    Raises:
        ApiError: ``invalid`` naming the model's own dimension.
    """
    if requested is None or dimension is None or requested <= dimension:
        return
    raise ApiError(
        "invalid",
        f"dimensions={requested} is over the model's own: it produces {dimension}-dimensional "
        f"embeddings; pass at most {dimension} (fewer keeps the first values, renormalised)",
        param="dimensions",
    )


def shorten(
    vectors: Sequence[Any], dimensions: int | None, *, normalized: bool = True
) -> Sequence[Any]:
    """Each vector's first ``dimensions`` values (None: as is).

    Vectors that were unit length (``normalized``) are scaled back to unit length; others
    are cut only, as ``SentenceTransformer.encode(..., truncate_dim=N)`` cuts them.
    """
    if dimensions is None or not vectors or len(vectors[0]) <= dimensions:
        return vectors
    cut = np.asarray(vectors, dtype=np.float32)[:, :dimensions]
    if not normalized:
        return list(cut)
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return list(cut / norms)


def shortened(dimensions: int | None, *, normalized: bool = True) -> Transform:
    """:func:`shorten` on rows: what a quantized answer's calibration is cut by too."""

    def transform(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        return np.asarray(shorten(list(rows), dimensions, normalized=normalized), np.float32)

    return transform


def embeddings_response(
    model: str, vectors: Sequence[Any], encoding_format: str, tokens: int, extra: bytes = b""
) -> bytes:
    """The response body: one embedding per input, in order, and the token usage.

    The bytes of ``{"object": "list", "data": [{"object": "embedding", "index": i,
    "embedding": ...}, ...], "model": ..., "usage": {"prompt_tokens": n, "total_tokens":
    n}}`` as compact JSON, written piece by piece: only the vectors go through the JSON
    encoder, not a dict per input around them. ``float`` vectors are float32 values written
    as JSON numbers (the shortest text of each as a double), ``base64`` ones little-endian
    float32 bytes. ``extra`` is more members, written as they are after ``usage``
    (``b',"id":"x"'``).
    """
    base64_format = encoding_format == "base64"
    parts = [b'{"object":"list","data":[']
    for i, vec in enumerate(vectors):
        quantized = isinstance(vec, np.ndarray) and vec.dtype.kind in "iu"  # embedding_type
        arr = vec if quantized else np.asarray(vec, dtype=np.float32)
        if base64_format:
            emb = b'"%s"' % base64.b64encode(arr.astype("<f4", copy=False).tobytes())
        else:
            emb = orjson.dumps(arr.tolist())
        parts.append(
            b'%s{"object":"embedding","index":%d,"embedding":%s}' % (b"," if i else b"", i, emb)
        )
    parts.append(
        b'],"model":%s,"usage":{"prompt_tokens":%d,"total_tokens":%d}%s}'
        % (json_bytes(model), tokens, tokens, extra)
    )
    return b"".join(parts)


def models_response(names: Sequence[str]) -> dict[str, Any]:
    """``GET /v1/models``: every served model."""
    return {"object": "list", "data": [model_entry(n) for n in names]}


def model_entry(name: str) -> dict[str, Any]:
    """One model as OpenAI lists it."""
    return {"id": name, "object": "model", "created": _CREATED, "owned_by": "batchserve"}


def error_body(error: ApiError) -> dict[str, Any]:
    """OpenAI's error shape, with the server's reason as ``code``."""
    return {
        "error": {
            "message": error.message,
            "type": _ERROR_TYPES.get(error.status, "invalid_request_error"),
            "param": error.param,
            "code": error.reason,
        }
    }


class EmbeddingsEndpoint:
    """``POST /v1/embeddings`` as an exchange's endpoint.

    Args:
        registry: the served models (the body names one; none named: the default).
        limits: the request limits.
    """

    protocol = "openai"
    #: The route named when a model of another kind is asked.
    route = "POST /v1/embeddings"
    #: The kinds of model it answers.
    kinds: tuple[Kind, ...] = (EMBEDDING,)
    body_types = frozenset({"application/json"})

    def __init__(self, registry: Registry, limits: RequestLimits) -> None:
        self.registry = registry
        self.limits = limits

    def parse(self, exchange: Exchange, body: bytes) -> Parsed:
        """The model the body names, the checked request, and its texts as the items."""
        req = self.request(body)
        model = self.model(req.model)
        try:
            if model.batcher is None:
                model.require_batcher()  # raises NotReady while it loads
            loaded = model.loaded
            assert loaded is not None
            if loaded.kind not in self.kinds:
                raise ApiError(
                    "wrong_kind",
                    wrong_kind(model.name, loaded.kind, self.route),
                    "model",
                )
            check_dimensions(req.dimensions, loaded.dimension)
            check_declared_dimensions(req.dimensions, loaded, self.limits)
            if req.embedding_type != "float":
                if req.encoding_format == "base64":  # a client would decode ints as floats
                    raise ApiError(
                        "invalid",
                        f"embedding_type {req.embedding_type!r} is answered as JSON integers: "
                        "send encoding_format 'float' (base64 is read as float32 by clients)",
                        param="encoding_format",
                    )
                require_calibration(loaded, (req.embedding_type,), "embedding_type")
            if loaded.prompts is not None:  # the folder's default prompt, as encode() does
                req.texts = apply_prompt(req.texts, loaded.prompts, None)
            if req.long_inputs is not None:
                req.windows = split_windows(loaded, req.texts, req.long_inputs.overlap)
                if req.windows is not None:
                    check_queue(model, len(req.windows.items))
                    return Parsed(model, req, req.windows.items)
        except Exception as exc:
            raise ParseError(model, exc) from None
        return Parsed(model, req, req.texts)

    def answer(self, exchange: Exchange, served: list[Served[Any]]) -> Reply:
        """One embedding per input, in order, with the token usage, timing and truncation."""
        req: EmbeddingsRequest = exchange.request
        model = exchange.model
        assert model is not None
        loaded = model.loaded
        assert loaded is not None
        windows = req.windows
        texts = req.texts if windows is None else windows.items
        head = timing_head(served)
        counts = token_counts(loaded, texts)
        if counts is not None:
            tokens = sum(counts)
            cut = truncated(loaded, texts, counts)
            if cut:
                head += b"x-truncated-inputs: %d\r\n" % cut
        elif len(texts) == 1:
            tokens = len(texts[0].split())
        else:
            tokens = sum(len(t.split()) for t in texts)
        unit = loaded.normalized is not False  # not known (None): as before, renormalised
        outputs: Sequence[Any] = [s.output for s in served]
        if windows is not None:
            outputs = windows.pool(outputs, counts, normalize=loaded.normalized is True)
        vectors = shorten(outputs, req.dimensions, normalized=unit)
        if req.embedding_type != "float":
            rows = np.asarray(vectors, dtype=np.float32).reshape(len(vectors), -1)
            cut = req.dimensions is not None
            vectors = list(
                typed(
                    loaded,
                    rows,
                    req.embedding_type,  # type: ignore[arg-type]  # checked by its Choice
                    key=("openai", req.dimensions, unit) if cut else None,
                    transform=shortened(req.dimensions, normalized=unit) if cut else None,
                )
            )
        body = embeddings_response(model.name, vectors, req.encoding_format, tokens, self.extra())
        return Reply(200, [], body, head=head)

    def request(self, body: bytes) -> EmbeddingsRequest:
        """The checked request (a protocol of the same shape overrides it)."""
        return parse_embeddings_request(body, self.limits)

    def model(self, name: str | None) -> ServedModel:
        """The model ``name`` names (None: the default).

        Raises:
            ApiError: 404 ``not_found`` naming the models served.
        """
        return self.registry.require(name)

    def extra(self) -> bytes:
        """More members of the answer's JSON object, after ``usage`` (OpenAI's: none)."""
        return b""

    def error_body(self, error: ApiError) -> bytes:
        """OpenAI's error shape."""
        return json_bytes(error_body(error))
