"""An embedder: a text in, a float vector out.

A sentence-transformers folder, an encoder saved with ``save_pretrained`` (pooled as
sentence-transformers pools a folder without modules), the built-in MiniLM, a synthetic
model with a dimension, or an imported object that says ``kind = "embedding"``.
"""

from __future__ import annotations

from batchserve.models.kinds.activation import NONE
from batchserve.models.kinds.kind import WARMUP_TEXT, Kind, Vector

__all__ = ["EMBEDDING"]

EMBEDDING = Kind(
    name="embedding",
    item="text",
    head=Vector(),
    activation=NONE,
    prompts=True,
    warmup=WARMUP_TEXT,
    routes=(
        "POST /embed",
        "POST /v1/embeddings",
        "POST /similarity",
        "POST /embeddings",
        "POST /v2/embed",
        "POST /v1/embed",
    ),
    tasks=("embed",),
    gate="cosine",
)
