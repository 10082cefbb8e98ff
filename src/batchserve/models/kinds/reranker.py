"""A reranker: a (query, passage) pair in, one relevance logit out.

A sequence classification model with one label: what ``CrossEncoder.save`` or a
``...ForSequenceClassification.save_pretrained`` with ``num_labels=1`` writes. Its score is
the sigmoid of the logit, as TEI's ``/rerank`` and ``CrossEncoder.predict`` answer it.

Or an LLM reranker: a causal LM whose folder declares a yes/no template
(:mod:`.llm_template`); its one logit is ``logit(yes) - logit(no)``, whose sigmoid is the
model card's ``P(yes)``.
"""

from __future__ import annotations

from batchserve.models.kinds.activation import SIGMOID
from batchserve.models.kinds.kind import WARMUP_TEXT, Kind, Logits

__all__ = ["RERANKER"]

RERANKER = Kind(
    name="reranker",
    item="pair",
    head=Logits(output="score"),
    activation=SIGMOID,
    warmup=(WARMUP_TEXT, WARMUP_TEXT),
    routes=("POST /rerank", "POST /v2/rerank", "POST /v1/rerank", "POST /predict"),
    tasks=("rerank",),
    gate="order",
)
