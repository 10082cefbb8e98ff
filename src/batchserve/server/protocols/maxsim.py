"""Reranking with a multi-vector (ColBERT) model: MaxSim scores in any rerank shape.

A rerank task of a cross-encoder has one item per (query, passage) pair. A ColBERT model
encodes each text once: :func:`maxsim_task` turns a rerank :class:`Task` into one whose
items are the query, encoded as a query, then each passage, encoded as a document
(:class:`~batchserve.models.kinds.Marked`), batched with everyone's like any items; once
they are all encoded, each passage's score is its MaxSim with the query
(:func:`~batchserve.models.kinds.maxsim`, as ``pylate.scores.colbert_scores`` scores), and
the original task writes its answer from those scores (the multi-vector kind's activation
is none: ``raw_scores`` changes nothing). One query and N passages are N + 1 items.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchserve.models.kinds import MULTIVECTOR, Marked, maxsim, unpack
from batchserve.server.protocols.tasks import Task, TaskRequest

if TYPE_CHECKING:
    from batchserve.server.registry import ServedModel
    from batchserve.server.settings import RequestLimits

__all__ = ["maxsim_task"]


def maxsim_task(task: Task) -> Task:
    """``task`` (a rerank of (query, passage) pairs) answered by a multi-vector model."""

    def parse(data: Any, limits: RequestLimits) -> TaskRequest:
        req = task.parse(data, limits)
        pairs = req.items
        if pairs:
            query = pairs[0][0]
            req.items = [Marked(query, True), *(Marked(p[1], False) for p in pairs)]
        req.options["pairs"] = pairs
        return req

    def answer(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
        pairs = req.options["pairs"]
        scored: list[list[float]] = []
        if outputs:
            documents = [unpack(row) for row in outputs[1:]]
            scored = [[s] for s in maxsim(unpack(outputs[0]), documents)]
        # The answer reads the pairs (a passage's text, the tokens of each).
        inner = TaskRequest(
            model=req.model, items=pairs, truncate=req.truncate, options=req.options, task=task
        )
        return task.answer(model, inner, scored)

    return Task(
        route=task.route, kinds=(MULTIVECTOR,), parse=parse, answer=answer, field=task.field
    )
