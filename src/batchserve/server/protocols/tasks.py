"""The task APIs' shared part: a parsed request, its items, and the endpoint that runs it.

The task APIs are the routes that rerank, classify and embed in the shapes other servers
made familiar: text-embeddings-inference's (:mod:`~batchserve.server.protocols.tei`) and
Cohere's, Jina's and Infinity's (:mod:`~batchserve.server.protocols.rerankers`). Each
route is a :class:`Task`: a pure function from the body's JSON to a :class:`TaskRequest`
(its model name, its items, what to do with the results), and a function from the results
to the answer's body. :class:`TaskEndpoint` carries a task through an inference exchange
(:mod:`batchserve.server.exchange`) like any other protocol, so a rerank of one query and N
passages is N items (pairs) that batch with everyone else's by their tokens, under the same
bounded queue, deadlines, admission, bisection and accounting, and is answered whole or
refused whole.

Checks common to every task, done before anything is queued:

* the model: the one the body names, else the one of the route's kinds (see
  :func:`route_model`), and its kind answers the route (else 400 ``wrong_kind``, naming
  the kind and the route to use);
* the items fit: at most ``--max-inputs`` per request and never more than the model's queue
  holds (a request that could never be admitted whole is refused at once, 413, saying
  which limit); a rerank of 1,000 passages under those limits is served in passes;
* the prompt of a model whose kind takes prompts (an embedder: ``prompt_name``, else the
  folder's default prompt) is prepended to each text, as ``SentenceTransformer.encode``
  does; an unknown name is 422 naming the field and the prompts the model has;
* a ``dimensions`` the model does not declare it was trained for (422, naming the values
  it does; :mod:`~batchserve.server.protocols.dimensions`);
* ``truncate=false``: an item over the model's window is refused (413), naming the input
  and its token count. Otherwise inputs over the window are truncated, and the answer says
  how many in the ``X-Truncated-Inputs`` header, and the tokens its items took in
  ``X-Compute-Tokens``, as TEI does (:mod:`~batchserve.server.protocols.window`).

The activation of a sequence classification model's logits is its kind's
(:mod:`batchserve.models.kinds.activation`: a sigmoid for a reranker's one logit and a
softmax for a classifier's, as TEI does), applied per request by :func:`scores`, or none
when the request asks for raw scores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from batchserve.batcher import Served
from batchserve.models.kinds import Activation, Kind, apply_prompt, wrong_kind
from batchserve.server.exchange import Exchange, Parsed, ParseError, Reply, timing_head
from batchserve.server.http import load_json
from batchserve.server.protocols.dimensions import check_declared_dimensions
from batchserve.server.protocols.long_inputs import Windows, split_windows
from batchserve.server.protocols.window import (
    TRUNCATED_HEADER,
    refuse_over_window,
    token_counts,
    truncated,
)
from batchserve.server.statuses import ApiError

if TYPE_CHECKING:
    from batchserve.server.registry import Registry, ServedModel
    from batchserve.server.settings import RequestLimits

__all__ = [
    "TRUNCATED_HEADER",
    "TaskRequest",
    "Task",
    "TaskEndpoint",
    "by_score",
    "route_model",
    "scores",
]


@dataclass(slots=True, kw_only=True)
class TaskRequest:
    """A checked task request (one per request: not frozen, for speed).

    Attributes:
        model: the model named by the body (None: the route's default).
        items: what the batcher runs, in order: texts, or (query, passage) pairs.
        truncate: whether inputs over the window are truncated (else refused).
        options: the route's own settings (``raw_scores``, ``top_n``...), read by its answer.
        task: the task that parsed it (``POST /`` picks one by the model's kind).
        windows: where inputs over the window were split (``options["long_inputs"]``),
            how to pool the windows' outputs back into one per input; ``items`` are then
            the windows.
    """

    model: str | None
    items: list[Any]
    truncate: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    task: Task | None = None
    windows: Windows | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """One task route: how its body is read and its answer written.

    Attributes:
        route: ``POST /rerank`` and the like (named in errors).
        kinds: the model kinds it answers, in order of preference: a body that names no
            model, on a server of several, goes to the model of the first kind served
            (:func:`route_model`).
        parse: a pure function from the body's JSON and the limits to a :class:`TaskRequest`.
        answer: the answer's body from the model, the request and each item's output.
        field: the body's field that holds the items, as an error about item ``i`` names it
            (``inputs[i]``).
        prepare: what the request needs of the model before its prompts are applied (a
            ``prompt_name`` read from the model's prompts, inputs cut to its window), or
            checks it must pass against the model; None: nothing.
        dimensions_field: the body's field that ``options["dimensions"]`` was read from,
            as the refusal of a value the model does not declare names it
            (:mod:`~batchserve.server.protocols.dimensions`).
    """

    route: str
    kinds: tuple[Kind, ...]
    parse: Callable[[Any, RequestLimits], TaskRequest]
    answer: Callable[[ServedModel, TaskRequest, list[Any]], bytes]
    field: str = "input"
    prepare: Callable[[ServedModel, TaskRequest], None] | None = None
    dimensions_field: str = "dimensions"


def scores(outputs: Sequence[npt.ArrayLike], activation: Activation) -> list[list[float]]:
    """Each item's scores: its logits (one row per item) through ``activation``.

    ``activation`` is the model kind's (:meth:`~batchserve.models.kinds.Kind.scoring`: its
    own, or none for raw scores), or one a request names.
    """
    if not outputs:
        return []
    logits = np.asarray(outputs, dtype=np.float64).reshape(len(outputs), -1)
    out: list[list[float]] = activation(logits).tolist()
    return out


class TaskEndpoint:
    """A task route as an exchange's endpoint (see the module docstring).

    Which model answers: the one the body's ``model`` names; else, with one model served,
    that one (clients of hosted APIs send their own names, ``rerank-v3.5``, and TEI's
    routes name none); else, by :func:`route_model`, the model of the route's kind (TEI's
    ``/rerank`` reaches the reranker of a server that also serves an embedder).

    Args:
        registry: the served models.
        limits: the request limits.
        choose: the task for a body and a model's kind (one route, one task, except ``POST /``).
        protocol: the metrics label (``tei``, ``cohere``, ``jina``).
        error_body: the protocol's error body.
        kinds: the model kinds the route answers, in order of preference (None: any,
            ``POST /`` answering each model's own task).
    """

    body_types = frozenset({"application/json"})

    def __init__(
        self,
        registry: Registry,
        limits: RequestLimits,
        *,
        choose: Callable[[Any, Kind], Task],
        protocol: str,
        error_body: Callable[[ApiError], bytes],
        kinds: tuple[Kind, ...] | None = None,
    ) -> None:
        self.registry = registry
        self.limits = limits
        self.protocol = protocol
        self._choose = choose
        self._error_body = error_body
        self._kinds = kinds

    def parse(self, exchange: Exchange, body: bytes) -> Parsed:
        """The model (the body's, else the default), the checked request and its items."""
        data = load_json(body)
        name = data.get("model") if isinstance(data, dict) else None
        model = self._model(name if isinstance(name, str) and name else None)
        try:
            return Parsed(model, *self._checked(model, data))
        except Exception as exc:
            raise ParseError(model, exc) from None

    def _checked(self, model: ServedModel, data: Any) -> tuple[TaskRequest, list[Any]]:
        if model.batcher is None:
            model.require_batcher()  # raises NotReady while it loads
        loaded = model.loaded
        assert loaded is not None
        kind = loaded.kind
        task = self._choose(data, kind)
        if kind not in task.kinds:
            raise ApiError("wrong_kind", wrong_kind(model.name, kind, task.route), "model")
        req = task.parse(data, self.limits)
        req.task = task
        if task.prepare is not None:
            task.prepare(model, req)
        if kind.prompts:
            try:
                req.items = apply_prompt(req.items, loaded.prompts, req.options.get("prompt_name"))
            except KeyError as exc:
                raise ApiError("invalid", exc.args[0], param="prompt_name") from None
        split = req.options.get("long_inputs")
        if split is not None:
            req.windows = split_windows(loaded, req.items, split.overlap)
            if req.windows is not None:
                req.items = req.windows.items
        items = req.items
        queue = model.config.queue_size
        if len(items) > queue:
            raise ApiError(
                "too_large",
                f"the request holds {len(items)} inputs and model {model.name!r} queues at most "
                f"{queue} (--queue-size): it could never be admitted whole",
                param="input",
            )
        if not req.truncate and split is None:
            splits = "long_inputs" in req.options
            refuse_over_window(loaded, items, task.field, splits=splits)
        dims = req.options.get("dimensions")
        check_declared_dimensions(dims, loaded, self.limits, task.dimensions_field)
        return req, items

    def _model(self, name: str | None) -> ServedModel:
        return route_model(self.registry, name, self._kinds)

    def answer(self, exchange: Exchange, served: list[Served[Any]]) -> Reply:
        """The task's answer, with the timing headers, the tokens and the truncation count."""
        req: TaskRequest = exchange.request
        model = exchange.model
        assert model is not None
        assert model.loaded is not None
        assert req.task is not None
        outputs: list[Any] = [s.output for s in served]
        counts = token_counts(model.loaded, req.items)
        if req.windows is not None:
            unit = model.loaded.normalized is True
            outputs = list(req.windows.pool(outputs, counts, normalize=unit))
        body = req.task.answer(model, req, outputs)
        head = timing_head(served)
        if counts is not None:
            head += b"x-compute-tokens: %d\r\n" % sum(counts)
            cut = truncated(model.loaded, req.items, counts)
            if cut:
                head += b"x-truncated-inputs: %d\r\n" % cut
        return Reply(200, [], body, head=head)

    def error_body(self, error: ApiError) -> bytes:
        """The protocol's error body."""
        return self._error_body(error)


def route_model(registry: Registry, name: str | None, kinds: Sequence[Kind] | None) -> ServedModel:
    """The model that answers a route of ``kinds`` for a body naming ``name``.

    The one named; else, with one model served, that one. Else the route's kinds are tried
    in their order of preference, and the first that some model is of answers: the default
    model if it is of that kind, or the only model that is (so ``/predict``, which a
    classifier and a reranker both answer, reaches the one classifier of a server that also
    serves a reranker, and the reranker only when no classifier is served). A name that is
    not served, with several models and not one of that kind, is 404 naming the models;
    several of that kind and none named, 422 naming them.

    Raises:
        ApiError: 404 ``not_found`` for a name not served (naming the models), 422
            ``invalid`` when several models answer and none is named.
    """
    models = registry.models
    if name is not None and name in models:
        return models[name]
    default = registry.default
    if len(models) == 1 or kinds is None:
        if name is not None and len(models) > 1:
            return registry.require(name)  # 404, naming the models
        return default
    fits: list[ServedModel] = []
    for kind in kinds:
        fits = [m for m in models.values() if _kind(m) is kind]
        if fits:
            break
    if default in fits:
        if name is not None:
            return registry.require(name)  # 404, naming the models
        return default
    if len(fits) == 1:
        return fits[0]
    if name is not None or not fits:
        return registry.require(name)  # 404 naming the models; none: wrong_kind
    raise ApiError(
        "invalid",
        f"several models answer this route ({', '.join(m.name for m in fits)}); "
        "name one in the body's model",
        param="model",
    )


def _kind(model: ServedModel) -> Kind | None:
    loaded = model.loaded
    return loaded.kind if loaded is not None else None


def by_score(entry: dict[str, Any]) -> float:
    """The sort key of results listed highest score first."""
    return -float(entry["score"])


def tokens_of(model: ServedModel, items: Sequence[Any]) -> int:
    """The tokens ``items`` took in their passes (words when the model counts none)."""
    loaded = model.loaded
    count = loaded.count_tokens if loaded is not None else None
    if count is not None:
        return sum(count(items))
    return sum(len(i.split()) if isinstance(i, str) else 1 for i in items)
