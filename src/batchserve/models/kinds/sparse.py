"""A sparse embedder: a text in, one weight per vocabulary term out (SPLADE).

A sentence-transformers ``SparseEncoder`` folder (a masked-LM transformer, then SPLADE
pooling: the log of one plus the ReLU of each token's logits, the max or sum over tokens),
or a bare ``...ForMaskedLM`` folder the operator serves with ``--pooling splade``. Its
texts take the folder's named prompts as ``SparseEncoder.encode`` prepends them. It runs
on torch only: no gate judges an exported engine's sparse vectors yet (``gate`` None), so
``--backend auto`` is torch and an exported backend is refused.
"""

from __future__ import annotations

from batchserve.models.kinds.activation import NONE
from batchserve.models.kinds.kind import WARMUP_TEXT, Kind, Sparse

__all__ = ["SPARSE"]

SPARSE = Kind(
    name="sparse",
    item="text",
    head=Sparse(),
    activation=NONE,
    prompts=True,
    warmup=WARMUP_TEXT,
    routes=("POST /embed_sparse",),
    tasks=("embed_sparse",),
)
