"""The server's live status as one small JSON document: what ``/dashboard`` and ``top`` show.

Built on demand from what the server already keeps, so asking costs the request path
nothing: the request counters and pass accounting of :class:`~batchserve.server.ops.metrics.Metrics`
(through :meth:`~batchserve.server.ops.metrics.Metrics.account`) and each batcher's frozen
``statistics()``. Per model:

* ``requests``: requests by outcome (every outcome, zeros included) since the start; a
  viewer that polls turns two readings into rates;
* ``refusals``: refused requests by reason (``queue_full``, ``infeasible``, ``draining``,
  ``not_ready``); ``errors``: every other reason that was not a success;
* ``queue``: items waiting now against the queue's size, items in passes now;
* ``batches``: passes, items, the mean and the distribution of batch sizes (size ->
  passes), against the ``max_batch_size`` in force;
* ``queue_wait_s`` and ``forward_s``: p50 and p99 over the latest items and passes (a
  bounded window: how it is now, not since the start), with the window's size;
* ``cost``: the cost model's current fit ``fixed_s + n * per_item_s`` and the passes it was
  fitted on, beside the measured mean forward time of each batch size;
* ``tokens`` (None unless passes are formed by tokens): padded and real tokens of the
  dispatched passes' sub-passes, their ratio ``waste``, the tokens queued now, the token
  cost model's fit of one sub-pass, ``fixed_s + padded tokens * per_token_s + padded tokens
  x length * attention_s``;
* ``kind``: ``embedding``, ``reranker``, ``classifier`` or ``generic`` (None while it
  loads), and ``labels``: a reranker's or classifier's labels, in order;
* ``item``: what one item is, the unit of every count of items here (``queue``,
  ``batches``, ``cost.per_item_s``, ``passes``): ``pair`` for a reranker (one query and
  one passage: a rerank of N passages is N items), ``text`` for an embedder or a
  classifier (a pair sent to a classifier's ``/predict`` is one item too, counted as a
  text), None for a generic model and while the model loads
  (:func:`~batchserve.models.kinds.item_of`);
* ``engine`` (None for a model that is not ``minilm`` or a folder, or not loaded yet): the
  backend, precision, device and threads it runs on and, under ``--backend auto``,
  ``choice``: the chosen engine and every candidate's measured rate and quality figures;
* ``passes`` (None unless the model runs on an engine): what its passes computed as
  length-sorted sub-passes since the start (passes, sub-passes, real tokens, tokens
  computed and those whole padded passes would have computed, their ratio ``waste``) and
  the sub-pass cost it learned (:class:`~batchserve.engines.passes.PassStatistics`).
* ``cuda_graphs`` (None unless a torch engine on a CUDA GPU replays its passes as graphs):
  graphs held, captured and replayed, sub-passes run eagerly, and why the graphs are off
  if a capture failed its check (:mod:`batchserve.engines.cuda_graphs`).

Requests whose model was never known (a 404, a body that did not parse) are counted in the
server's ``requests`` only.
"""

from __future__ import annotations

import time
from typing import Any

from batchserve import __version__
from batchserve.models.kinds import item_of
from batchserve.policy import PolicyStats
from batchserve.server.account import quantile
from batchserve.server.ops.metrics import (
    OUTCOME_OF_REASON,
    REQUEST_OUTCOMES,
    UNKNOWN_MODEL,
    Metrics,
)
from batchserve.server.registry import ServedModel

__all__ = ["REFUSALS", "server_status"]

#: The reasons a request is refused (outcome ``rejected``), in display order.
REFUSALS = tuple(r for r, o in OUTCOME_OF_REASON.items() if o == "rejected")


def _window(values: tuple[float, ...]) -> dict[str, Any]:
    return {"p50": quantile(values, 0.5), "p99": quantile(values, 0.99), "n": len(values)}


def _passes(model: ServedModel) -> dict[str, Any] | None:
    engine = model.loaded.on_engine if model.loaded is not None else None
    return engine.statistics().to_dict() if engine is not None else None


def _graphs(model: ServedModel) -> dict[str, Any] | None:
    engine = model.loaded.on_engine if model.loaded is not None else None
    return engine.graph_statistics() if engine is not None else None


def model_status(model: ServedModel, metrics: Metrics) -> dict[str, Any]:
    """One model's entry (see the module docstring)."""
    account = metrics.account(model.name)
    stats = metrics.stats(model.name)
    batch = model.config
    requests = dict.fromkeys(REQUEST_OUTCOMES, 0)
    refusals = dict.fromkeys(REFUSALS, 0)
    errors: dict[str, int] = {}
    for (outcome, reason), n in account.requests.items():
        requests[outcome] = requests.get(outcome, 0) + n
        if outcome == "rejected":
            refusals[reason] = refusals.get(reason, 0) + n
        elif outcome != "ok":
            errors[reason] = errors.get(reason, 0) + n
    sizes = dict(sorted(stats.batch_sizes.items())) if stats is not None else {}
    kind = model.loaded.kind if model.loaded is not None else None
    return {
        "state": model.state,
        "kind": kind.name if kind is not None else None,
        "item": item_of(kind),
        "labels": list(model.loaded.labels) if model.loaded is not None else [],
        "engine": model.loaded.engine if model.loaded is not None else None,
        "passes": _passes(model),
        "cuda_graphs": _graphs(model),
        "settings": {
            "max_batch_size": batch.max_batch_size,
            "max_wait_s": batch.max_wait_s,
            "queue_size": batch.queue_size,
            "workers": batch.workers,
            "timeout_s": model.settings.timeout_s,
            "admission": batch.admission,
            # In force once the model is loaded; the setting (auto: by the model) before.
            "batch_by": batch.batch_by
            if stats is None
            else ("count" if stats.tokens is None else "tokens"),
            "max_batch_tokens": batch.max_batch_tokens,
        },
        "requests": requests,
        "refusals": refusals,
        "errors": dict(sorted(errors.items())),
        "queue": {
            "depth": stats.queue_depth if stats is not None else 0,
            "size": batch.queue_size,
            "running_items": stats.running_items if stats is not None else 0,
        },
        "batches": {
            "passes": account.passes,
            "items": account.items,
            "mean_size": account.items / account.passes if account.passes else 0.0,
            "sizes": {str(n): c for n, c in sizes.items()},
        },
        "tokens": _tokens(stats),
        "queue_wait_s": _window(account.recent_queue_wait_s),
        "forward_s": _window(account.recent_forward_s),
        "cost": {
            "fixed_s": stats.cost.fixed_s if stats is not None else None,
            "per_item_s": stats.cost.per_item_s if stats is not None else None,
            "samples": stats.cost_samples if stats is not None else 0,
            "measured": [
                {"size": n, "passes": passes, "mean_forward_s": seconds / passes}
                for n, (passes, seconds) in account.by_size.items()
            ],
        },
    }


def _tokens(stats: PolicyStats | None) -> dict[str, Any] | None:
    tok = stats.tokens if stats is not None else None
    if tok is None:
        return None
    return {
        "padded": tok.padded,
        "real": tok.real,
        "queued": tok.queued,
        "waste": tok.waste,
        "fixed_s": tok.cost.fixed_s,
        "per_token_s": tok.cost.per_token_s,
        "attention_s": tok.cost.attention_s,
    }


def server_status(
    models: list[ServedModel], metrics: Metrics, *, started_unix: float, draining: bool
) -> dict[str, Any]:
    """``GET /status``: the server's counters and every model's entry, now."""
    requests = dict.fromkeys(REQUEST_OUTCOMES, 0)
    unknown = 0
    for (model, outcome, _), n in metrics.requests.items():
        requests[outcome] = requests.get(outcome, 0) + n
        if model == UNKNOWN_MODEL:
            unknown += n
    now = time.time()
    return {
        "name": "batchserve",
        "version": __version__,
        "time_unix": now,
        "uptime_s": now - started_unix,
        "draining": draining,
        "received": metrics.received,
        "in_flight": metrics.in_flight,
        "requests": requests,
        "unknown_model_requests": unknown,
        "models": {m.name: model_status(m, metrics) for m in models},
    }
