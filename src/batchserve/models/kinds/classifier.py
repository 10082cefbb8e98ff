"""A classifier: a text (or a pair) in, one logit per label out.

A sequence classification model with several labels, named by its ``id2label``. Its
scores are the softmax of the logits, a probability per label. It may be sent a pair
(TEI's ``/predict``): one item like a text, one sequence through the model, counted as a
``text`` (the unit names the kind's usual input; a pass may mix both).
"""

from __future__ import annotations

from batchserve.models.kinds.activation import SOFTMAX
from batchserve.models.kinds.kind import WARMUP_TEXT, Kind, Logits

__all__ = ["CLASSIFIER"]

CLASSIFIER = Kind(
    name="classifier",
    item="text",
    head=Logits(output="probabilities"),
    activation=SOFTMAX,
    warmup=WARMUP_TEXT,
    routes=("POST /predict", "POST /classify"),
    tasks=("classify",),
    gate="label",
)
