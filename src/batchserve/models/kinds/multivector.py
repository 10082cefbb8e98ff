"""A multi-vector model (ColBERT): a text in, one projected unit vector per kept token out.

A ColBERT folder as PyLate saves it (``ColBERT.save``): the transformer, a ``Dense``
projection (``pylate.models.Dense.Dense``), and in ``config_sentence_transformers.json``
(``model_type: ColBERT``) its query and document markers (``query_prefix`` ``[Q] ``,
``document_prefix`` ``[D] ``), ``query_length``, ``document_length``,
``do_query_expansion``, ``attend_to_expansion_tokens`` and ``skiplist_words``. A text is
encoded as a query or as a document (:class:`Marked`), as ``ColBERT.encode(texts,
is_query=...)`` encodes it: a query padded with ``[MASK]`` to ``query_length`` and every
token kept (query expansion), a document cut to ``document_length`` with its padding and
its skiplist tokens (punctuation) dropped. Two texts are scored by MaxSim
(:func:`maxsim`): for each query vector, its largest dot product with the document's
vectors, summed, as ``pylate.scores.colbert_scores`` scores them.

An item's answer is one row (the batcher's unit is a row of floats) packed by the engine
and read by :func:`unpack`: its number of kept tokens, the dimension, then the vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from batchserve.models.kinds.activation import NONE
from batchserve.models.kinds.kind import WARMUP_TEXT, Kind, Tokens

__all__ = ["MULTIVECTOR", "Marked", "maxsim", "pack", "unpack"]


class Marked(NamedTuple):
    """A multi-vector model's item: a text, encoded as a query or as a document.

    A plain string is a document.

    Attributes:
        text: the text.
        query: encoded as a query (its marker, expanded to ``query_length``).
    """

    text: str
    query: bool


MULTIVECTOR = Kind(
    name="multivector",
    item="text",
    head=Tokens(),
    activation=NONE,
    warmup=WARMUP_TEXT,
    routes=("POST /embed_all", "POST /rerank", "POST /v2/rerank", "POST /v1/rerank"),
    tasks=("embed", "rerank"),
)


def pack(vectors: npt.NDArray[np.float32], width: int) -> npt.NDArray[np.float32]:
    """One item's kept token vectors (tokens x dimension) as a row of ``width`` floats."""
    n, dim = vectors.shape
    row = np.zeros(width, dtype=np.float32)
    row[0] = n
    row[1] = dim
    row[2 : 2 + n * dim] = vectors.reshape(-1)
    return row


def unpack(row: Any) -> npt.NDArray[np.float32]:
    """The token vectors (tokens x dimension) a row packed by :func:`pack` holds."""
    flat = np.asarray(row, dtype=np.float32).reshape(-1)
    n, dim = int(flat[0]), int(flat[1])
    return flat[2 : 2 + n * dim].reshape(n, dim)


def maxsim(query: Any, documents: Sequence[Any]) -> list[float]:
    """Each document's MaxSim score for ``query`` (token vectors, tokens x dimension).

    The sum over the query's vectors of each one's largest dot product with a document's.
    """
    q = np.asarray(query, dtype=np.float32)
    return [float((q @ np.asarray(d, dtype=np.float32).T).max(axis=1).sum()) for d in documents]
