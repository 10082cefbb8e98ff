"""The KServe v2 / Open Inference Protocol: metadata, health and ``infer``.

An infer request is parsed by :func:`parse_infer_request` (JSON, or JSON plus binary tensor
data: see :mod:`batchserve.server.protocols.tensors`) into the items the batcher runs:

* an **embedding** model takes one ``BYTES`` input of shape ``[N]`` or ``[N, 1]`` (UTF-8
  texts) and answers the ``FP32`` output ``embedding`` of shape ``[N, dim]``;
* a **reranker** takes the ``BYTES`` inputs ``query`` (one text, or one per passage) and
  ``passage`` and answers ``FP32`` ``score`` ``[N, 1]`` (the sigmoid of each pair's logit);
* a **classifier** takes ``BYTES`` ``text`` and answers ``FP32`` ``probabilities``
  ``[N, labels]`` (the softmax, columns in ``id2label`` order);
* a **generic** model takes any tensors whose first axis is the batch: with one input each
  item is one row (a numpy array, or ``bytes`` for ``BYTES``), with several each item is a
  dict from input name to row. Its per-item outputs are stacked into the output ``output``
  (or, when they are dicts, one output per key).

An embedding model's prompt is prepended to each text as on every other route (and as
``SentenceTransformer.encode`` does): the one ``parameters.prompt_name`` names, else the
folder's default prompt, so every route of a server gives one text the same vector; an
unknown name is 422 naming ``parameters.prompt_name`` and the prompts the model has. The
answer's ``X-Truncated-Inputs`` header says how many texts the model's window cut (over
gRPC, the trailing metadata of that name).

``parameters.timeout`` is the request's timeout in microseconds, as Triton reads it. Outputs
are binary when the request asks it (``outputs[].parameters.binary_data``, or
``parameters.binary_data_output`` when it lists no outputs), JSON otherwise. Errors are
``{"error": "<message>"}``.

:class:`InferEndpoint` is the protocol's part of an inference exchange
(:mod:`batchserve.server.exchange`): the model comes from the path, the items and the
deadline's ``parameters.timeout`` from the body.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, assert_never

import numpy as np

from batchserve import __version__
from batchserve.batcher import Served
from batchserve.models.kinds import (
    CLASSIFIER,
    EMBEDDING,
    GENERIC,
    RERANKER,
    Kind,
    Logits,
    Marked,
    Sparse,
    Tensors,
    Tokens,
    Vector,
    apply_prompt,
    unpack,
)
from batchserve.models.loader import LoadedModel
from batchserve.server.exchange import Exchange, Parsed, Reply, timing_head
from batchserve.server.http import json_bytes, load_json
from batchserve.server.protocols import bodies
from batchserve.server.protocols.bodies import tensor_parameters
from batchserve.server.protocols.tensors import Tensor, decode_tensor, encode_tensor
from batchserve.server.protocols.window import truncated_head
from batchserve.server.settings import RequestLimits
from batchserve.server.statuses import ApiError
from batchserve.server.tenancy import resolve_class

if TYPE_CHECKING:
    from batchserve.server.registry import ServedModel

__all__ = [
    "EMBEDDING_OUTPUT",
    "GENERIC_OUTPUT",
    "PASSAGE_INPUT",
    "PROBABILITIES_OUTPUT",
    "QUERY_INPUT",
    "SCORE_OUTPUT",
    "TEXT_INPUT",
    "InferEndpoint",
    "InferRequest",
    "build_infer_response",
    "embedding_items",
    "generic_items",
    "model_metadata",
    "parse_infer_request",
    "parsed",
    "server_metadata",
    "stack_outputs",
]

#: A model's texts (an embedder's, a classifier's: a kind whose item is a text).
TEXT_INPUT = "text"
#: A pair's inputs (a reranker's: a query, broadcast when it is one, and its passages).
QUERY_INPUT = "query"
PASSAGE_INPUT = "passage"
#: Each kind's output is named by its head (:class:`~batchserve.models.kinds.Kind`): an
#: embedder's vectors, a reranker's score (the sigmoid of each pair's logit, as TEI's
#: /rerank answers by default), a classifier's probabilities (the softmax over its labels,
#: in ``id2label`` order), a generic model's stacked outputs.
EMBEDDING_OUTPUT = EMBEDDING.head.output
SCORE_OUTPUT = RERANKER.head.output
PROBABILITIES_OUTPUT = CLASSIFIER.head.output
GENERIC_OUTPUT = GENERIC.head.output

#: The limits the infer body's described fields read (none: a tensor's are checked by kind).
_UNREAD = RequestLimits()


@dataclass(frozen=True, slots=True, kw_only=True)
class InferRequest:
    """A parsed infer request.

    Attributes:
        id: the request's id, echoed back.
        inputs: the decoded input tensors, in order.
        outputs: the outputs asked for, name -> binary (empty: all outputs).
        binary_default: outputs not listed are binary (``parameters.binary_data_output``).
        timeout_s: ``parameters.timeout`` converted to seconds, if given.
        priority: ``parameters.priority`` (Triton's level, 1 = most urgent, 0 = default), or
            a class name; read only by models with classes of work.
        prompt_name: ``parameters.prompt_name``, the embedding model's prompt to prepend
            (None: its default prompt, if it has one).
        is_query: ``parameters.is_query``: a multi-vector model's texts encoded as queries.
        texts: an embedding model's texts as they ran (prompt prepended), once parsed for
            the model: what its answer counts truncations of.
    """

    id: str | None
    inputs: list[Tensor]
    outputs: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False
    timeout_s: float | None = None
    priority: int | str | None = None
    prompt_name: str | None = None
    is_query: bool = False
    texts: tuple[str, ...] = ()


def server_metadata() -> dict[str, Any]:
    """``GET /v2``."""
    return {
        "name": "batchserve",
        "version": __version__,
        # Triton's: model configuration and statistics (see batchserve.server.protocols.triton).
        "extensions": ["binary_tensor_data", "model_configuration", "statistics"],
    }


def model_metadata(name: str, loaded: LoadedModel | None) -> dict[str, Any]:
    """``GET /v2/models/{name}``: inputs and outputs (empty for a generic model).

    The inputs are those of its kind's item, the outputs those of its kind's head.
    """
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    if loaded is not None:
        # [-1, 1], as Triton states a batch of strings: its tools need a shape per row.
        # Requests may send [N] or [N, 1].
        inputs = [
            {"name": n, "datatype": "BYTES", "shape": [-1, 1]} for n in _input_names(loaded.kind)
        ]
        head = loaded.kind.head
        width = _output_width(loaded)
        if isinstance(head, Tokens):
            # Ragged: padded to the longest item's tokens, with each item's count.
            outputs = [
                {"name": head.output, "datatype": "FP32", "shape": [-1, -1, -1]},
                {"name": head.counts, "datatype": "INT32", "shape": [-1]},
            ]
        elif width is not None:
            shape = [-1, width]
            outputs = [{"name": loaded.kind.head.output, "datatype": "FP32", "shape": shape}]
    return {
        "name": name,
        "versions": ["1"],
        "platform": "batchserve",
        "inputs": inputs,
        "outputs": outputs,
    }


def _input_names(kind: Kind) -> tuple[str, ...]:
    # The BYTES inputs of a kind's item (none: a generic model takes any tensors).
    match kind.item:
        case "text":
            return (TEXT_INPUT,)
        case "pair":
            return (QUERY_INPUT, PASSAGE_INPUT)
        case None:
            return ()
        case _:
            assert_never(kind.item)


def _output_width(loaded: LoadedModel) -> int | None:
    # The width of a head's FP32 output (-1: not known); None: no output is stated.
    head = loaded.kind.head
    match head:
        case Vector() | Sparse():
            return loaded.dimension or -1
        case Logits():
            return len(loaded.labels) or -1
        case Tensors() | Tokens():
            return None
        case _:
            assert_never(head)


def parse_infer_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse an infer body; ``header_length`` is the ``Inference-Header-Content-Length``.

    Raises:
        ApiError: ``malformed`` or ``invalid`` naming the field and the rule.
    """
    binary = b""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            n = -1
        if not 0 <= n <= len(body):
            raise ApiError(
                "malformed",
                f"Inference-Header-Content-Length must be an integer in 0..{len(body)} "
                f"(the body's length), got {header_length!r}",
                param="Inference-Header-Content-Length",
            )
        body, binary = body[:n], body[n:]
    data = load_json(body)
    fields = bodies.INFER.read(data, _UNREAD)
    params = fields["parameters"] or {}
    specs = fields["inputs"]
    inputs: list[Tensor] = []
    offset = 0
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict):
            raise ApiError("invalid", "each of inputs must be an object", param="inputs")
        size = tensor_parameters(spec, f"inputs[{i}]").get("binary_data_size")
        chunk = None
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ApiError("invalid", f"binary_data_size must be an integer >= 0, got {size!r}")
            if offset + size > len(binary):
                raise ApiError(
                    "malformed",
                    f"input {spec.get('name')!r}: binary_data_size {size} runs past the body",
                )
            chunk = binary[offset : offset + size]
            offset += size
        inputs.append(decode_tensor(spec, chunk))
    return InferRequest(
        id=fields["id"],
        inputs=inputs,
        outputs=fields["outputs"] or {},
        binary_default=params.get("binary_data_output", False),
        timeout_s=params.get("timeout"),
        priority=params.get("priority"),
        prompt_name=params.get("prompt_name"),
        is_query=params.get("is_query") is True,
    )


def embedding_items(request: InferRequest, limits: RequestLimits) -> list[str]:
    """The texts of an infer request to an embedding model.

    Raises:
        ApiError: not exactly one BYTES input of shape [N] or [N, 1], a text that is not
            UTF-8, empty or too long, or too many texts.
    """
    if len(request.inputs) != 1:
        raise ApiError(
            "invalid",
            f"an embedding model takes exactly 1 input (BYTES texts), got {len(request.inputs)}",
            param="inputs",
        )
    t = request.inputs[0]
    if t.datatype != "BYTES" or not (len(t.shape) == 1 or (len(t.shape) == 2 and t.shape[1] == 1)):
        raise ApiError(
            "invalid",
            f"input {t.name!r} must be BYTES of shape [N] or [N, 1], "
            f"got {t.datatype} {list(t.shape)}",
            param=t.name,
        )
    if not t.value:
        raise ApiError("invalid", f"input {t.name!r} must hold at least one text", param=t.name)
    if len(t.value) > limits.max_inputs:
        raise ApiError(
            "too_large",
            f"input {t.name!r} must hold at most {limits.max_inputs} texts (--max-inputs), "
            f"got {len(t.value)}",
            param=t.name,
        )
    texts = []
    for i, raw in enumerate(t.value):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError("invalid", f"{t.name}[{i}] must be UTF-8 text", param=t.name) from None
        if not text:
            raise ApiError("invalid", f"{t.name}[{i}] must not be empty", param=t.name)
        if len(text) > limits.max_input_chars:
            # Truncation is always on here: a longer text is cut, not refused (the model
            # would cut it to its window anyway).
            text = text[: limits.max_input_chars]
        texts.append(text)
    return texts


def generic_items(request: InferRequest, limits: RequestLimits) -> list[Any]:
    """The items of an infer request to a generic model: one per row of the first axis.

    Raises:
        ApiError: a scalar input, inputs of different batch sizes, or too many rows.
    """
    sizes = set()
    rows: dict[str, list[Any]] = {}
    for t in request.inputs:
        if not t.shape:
            raise ApiError(
                "invalid", f"input {t.name!r} must have a batch axis, got shape []", t.name
            )
        if t.shape[0] > limits.max_inputs:
            # Checked before the rows are made: a shape such as [10**9, 0] holds no data
            # at all, yet would make a billion rows.
            raise ApiError(
                "too_large",
                f"input {t.name!r} must hold at most {limits.max_inputs} rows (--max-inputs), "
                f"got {t.shape[0]}",
                param=t.name,
            )
        sizes.add(t.shape[0])
        if t.datatype == "BYTES":
            per = math.prod(t.shape[1:])
            flat = t.value
            rows[t.name] = (
                list(flat)
                if len(t.shape) == 1
                else [
                    np.array(flat[i * per : (i + 1) * per], dtype=object).reshape(t.shape[1:])
                    for i in range(t.shape[0])
                ]
            )
        else:
            rows[t.name] = list(t.value)
    if len(sizes) != 1:
        raise ApiError(
            "invalid", f"inputs must share their first (batch) axis, got sizes {sorted(sizes)}"
        )
    n = sizes.pop()
    if n == 0:
        raise ApiError("invalid", "inputs must hold at least one row", param="inputs")
    if len(rows) == 1:
        return next(iter(rows.values()))
    return [{name: r[i] for name, r in rows.items()} for i in range(n)]


def parsed(model: ServedModel, req: InferRequest, limits: RequestLimits) -> Parsed:
    """A parsed infer request to ``model``, with its items (both transports).

    Its class of work from ``parameters.priority`` (for a model with classes) and its
    timeout from ``parameters.timeout``, when the request gives them.

    The items are those of the model kind's item: texts, (query, passage) pairs, or rows of
    any tensors. A model whose kind takes prompts (an embedder) gets its prompt
    (``parameters.prompt_name``, else its default) prepended to each text, and the request
    keeps them for its answer (:attr:`InferRequest.texts`).

    Raises:
        ApiError: the inputs do not fit the model (see :func:`embedding_items`,
            :func:`generic_items`), an output it does not produce is asked for, the prompt
            is not one of the model's (or the model takes none), or the priority names
            no class of the model's.
    """
    loaded = model.loaded
    assert loaded is not None
    kind = loaded.kind
    if req.prompt_name is not None and not kind.prompts:
        raise ApiError(
            "invalid",
            f"parameters.prompt_name applies to an embedding model; model {model.name!r} is "
            f"a {kind.name} model",
            param="parameters.prompt_name",
        )
    items: list[Any]
    texts: list[str] = []
    match kind.item:
        case "text":
            items = texts = embedding_items(req, limits)
        case "pair":
            items = _pairs(req, limits)
        case None:
            items = generic_items(req, limits)
        case _:
            assert_never(kind.item)
    if isinstance(kind.head, Tokens):
        _only_outputs(req, kind.head.output, kind.head.counts)
        items = [Marked(text, req.is_query) for text in texts]
    elif not isinstance(kind.head, Tensors):
        _only_outputs(req, kind.head.output)
    if kind.prompts:
        try:
            items = apply_prompt(texts, loaded.prompts, req.prompt_name, "parameters.prompt_name")
        except KeyError as exc:
            raise ApiError("invalid", exc.args[0], param="parameters.prompt_name") from None
        req = dataclasses.replace(req, texts=tuple(items))
    work_class = None
    if req.priority is not None and model.classes is not None:
        work_class = resolve_class(model.classes, req.priority, "parameters.priority")
    return Parsed(model, req, items, req.timeout_s, work_class)


def _only_outputs(req: InferRequest, *names: str) -> None:
    extra = set(req.outputs) - set(names)
    if extra:
        raise ApiError(
            "invalid",
            f"outputs asks for {sorted(extra)}; this model produces {sorted(names)}",
            "outputs",
        )


def _pairs(req: InferRequest, limits: RequestLimits) -> list[tuple[str, str]]:
    """A reranker's (query, passage) pairs, from its two BYTES inputs.

    ``query`` holds one text (for every passage) or one per passage; ``passage`` the
    passages; each of shape [N] or [N, 1].

    Raises:
        ApiError: the inputs are not those two, or their counts do not match.
    """
    by_name = {t.name: t for t in req.inputs}
    if set(by_name) != {QUERY_INPUT, PASSAGE_INPUT}:
        raise ApiError(
            "invalid",
            f"a reranker takes the BYTES inputs {QUERY_INPUT!r} and {PASSAGE_INPUT!r}, "
            f"got {sorted(by_name)}",
            param="inputs",
        )
    one = dataclasses.replace(req, inputs=[by_name[QUERY_INPUT]])
    queries = embedding_items(one, limits)
    passages = embedding_items(dataclasses.replace(req, inputs=[by_name[PASSAGE_INPUT]]), limits)
    if len(queries) == 1:
        queries = queries * len(passages)
    if len(queries) != len(passages):
        raise ApiError(
            "invalid",
            f"input {QUERY_INPUT!r} must hold 1 text or one per passage ({len(passages)}), "
            f"got {len(queries)}",
            param=QUERY_INPUT,
        )
    return list(zip(queries, passages, strict=True))


def requested_outputs(request: InferRequest, outputs: dict[str, Any]) -> list[str]:
    """The outputs ``request`` asks for, in its order (all of them when it names none).

    Raises:
        ApiError: it asks for an output the model does not produce.
    """
    unknown = sorted(set(request.outputs) - set(outputs))
    if unknown:
        raise ApiError(
            "invalid",
            f"outputs asks for {', '.join(map(repr, unknown))}; this model produces "
            f"{', '.join(map(repr, outputs))}",
            param="outputs",
        )
    return list(request.outputs) if request.outputs else list(outputs)


def build_infer_response(
    *,
    model: str,
    request: InferRequest,
    outputs: dict[str, Any],
) -> tuple[bytes, int | None]:
    """Encode the response; returns the body and the JSON header's length if binary.

    Args:
        model: the model's name.
        request: the parsed request (which outputs, binary or JSON).
        outputs: output name -> stacked numpy array.

    Raises:
        ApiError: the request asked for an output the model does not produce.
    """
    names = requested_outputs(request, outputs)
    descs = []
    chunks = []
    for name in names:
        binary = request.outputs.get(name, request.binary_default)
        desc, raw = encode_tensor(name, outputs[name], binary=binary)
        descs.append(desc)
        if raw is not None:
            chunks.append(raw)
    head: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": descs}
    if request.id is not None:
        head["id"] = request.id
    header = json.dumps(head, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)


def stack_outputs(kind: Kind, results: Sequence[Any]) -> dict[str, Any]:
    """Stack per-item outputs into output tensors (name -> array), as the kind's head says.

    A vector per item is stacked as it is; logits per item through the kind's activation
    (a reranker's sigmoid, ``[N, 1]``; a classifier's softmax, ``[N, labels]``); anything
    else by its keys (per-item dicts) or as one tensor.

    Raises:
        ApiError: ``internal`` when the model's outputs cannot be stacked (ragged shapes).
    """
    head = kind.head
    match head:
        case Vector() | Sparse():  # a sparse row whole: the vocabulary's width, zeros kept
            return {head.output: np.asarray(results, dtype=np.float32)}
        case Logits():
            logits = np.asarray(results, dtype=np.float64)
            if logits.ndim == 1:  # one logit per item, each a scalar
                logits = logits[:, None]
            return {head.output: kind.activate(logits).astype(np.float32)}
        case Tokens():
            return _stack_tokens(head, results)
        case Tensors():
            return _stack_any(results)
        case _:
            assert_never(head)


def _stack_tokens(head: Tokens, results: Sequence[Any]) -> dict[str, Any]:
    # Each item's token vectors, padded with zeros to the longest item's tokens, and each
    # item's count of them: [N, T, D] and [N].
    vectors = [unpack(row) for row in results]
    longest = max((v.shape[0] for v in vectors), default=0)
    dim = vectors[0].shape[1] if vectors else 0
    padded = np.zeros((len(vectors), longest, dim), dtype=np.float32)
    for i, v in enumerate(vectors):
        padded[i, : v.shape[0]] = v
    counts = np.asarray([v.shape[0] for v in vectors], dtype=np.int32)
    return {head.output: padded, head.counts: counts}


def _stack_any(results: Sequence[Any]) -> dict[str, Any]:
    try:
        if results and all(isinstance(r, dict) for r in results):
            keys = list(results[0])
            return {k: _stack([r[k] for r in results]) for k in keys}
        return {GENERIC_OUTPUT: _stack(list(results))}
    except (KeyError, ValueError, TypeError) as exc:
        raise ApiError("internal", f"the model's outputs cannot form a tensor: {exc}") from None


def _stack(values: list[Any]) -> Any:
    if all(isinstance(v, str | bytes) for v in values):
        return np.array([v if isinstance(v, bytes) else v.encode() for v in values], dtype=object)
    return np.stack([np.asarray(v) for v in values])


_OCTETS = b"application/octet-stream"


class InferEndpoint:
    """``POST /v2/models/{name}/infer`` as an exchange's endpoint (the model from the path).

    Args:
        limits: the request limits.
    """

    protocol = "kserve"
    body_types = frozenset({"application/json", "application/octet-stream"})

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits

    def parse(self, exchange: Exchange, body: bytes) -> Parsed:
        """The path's model, the checked request and its items (see :func:`parsed`)."""
        model = exchange.model
        assert model is not None
        model.require_batcher()
        header = exchange.head.get(b"inference-header-content-length")
        req = parse_infer_request(body, None if header is None else header.decode("latin-1"))
        return parsed(model, req, self.limits)

    def answer(self, exchange: Exchange, served: list[Served[Any]]) -> Reply:
        """The output tensors, JSON or binary as asked, with the timing headers."""
        model = exchange.model
        assert model is not None
        assert model.loaded is not None
        outputs = stack_outputs(model.loaded.kind, [s.output for s in served])
        request: InferRequest = exchange.request
        out, header_len = build_infer_response(model=model.name, request=request, outputs=outputs)
        head = timing_head(served) + truncated_head(model.loaded, request.texts)
        if header_len is None:
            return Reply(200, [], out, head=head)
        head += b"inference-header-content-length: %d\r\n" % header_len
        return Reply(200, [], out, _OCTETS, head)

    def error_body(self, error: ApiError) -> bytes:
        """KServe's error shape, ``{"error": message}``."""
        return json_bytes({"error": error.message})
