"""What the server may ask of a model that runs on an engine: its declared interface.

A batch function (:mod:`batchserve.models.base`) is all the batcher knows of a model. A
model that runs on an engine (:mod:`batchserve.engines`: PyTorch, ONNX Runtime, OpenVINO)
also answers the routes and the operations views: its tokenizer (TEI's ``/tokenize`` and
``/decode``), its token counts (``usage``, the truncation count, ``truncate: false``), its
window, pooling and normalization (``/info``, a route that normalizes on request), how it
runs, and what its passes did (``/status``). :class:`Engine` names all of it, so that the
server reads an engine's fields instead of probing an object for them;
:class:`~batchserve.models.loader.LoadedModel` carries it as ``on_engine``.

The core never imports the engines: they state this protocol, and the server reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from batchserve.models.kinds import Kind

__all__ = ["Engine", "Statistics"]


class Statistics(Protocol):
    """A snapshot of what an engine's passes did, as JSON-ready values."""

    def to_dict(self) -> dict[str, Any]:
        """The figures (passes, sub-passes, tokens, the cost learned), JSON-ready."""
        ...


class Engine(Protocol):
    """A model on an engine, as the server sees it (see the module docstring).

    Calling it blocks for the pass (run it in a worker); it may be called from several
    threads at once.
    """

    @property
    def kind(self) -> Kind:
        """Its kind: an embedder, a reranker or a classifier (:mod:`batchserve.models.kinds`)."""
        ...

    @property
    def backend(self) -> str:
        """``torch``, ``onnx``, ``onnx-int8``, ``openvino`` or ``openvino-int8``."""
        ...

    @property
    def device(self) -> str:
        """Where the passes run (``cpu``, ``cuda:N``, ``mps``)."""
        ...

    @property
    def dtype(self) -> str:
        """The precision it computes in."""
        ...

    @property
    def threads(self) -> int:
        """CPU threads per pass."""
        ...

    @property
    def dimension(self) -> int:
        """A row's length: a vector's dimension, or one logit per label."""
        ...

    @property
    def labels(self) -> tuple[str, ...]:
        """The label of each logit, in order (none for an embedding model)."""
        ...

    @property
    def max_seq_length(self) -> int:
        """The window in tokens; a longer input is truncated to it."""
        ...

    @property
    def pooling(self) -> str | None:
        """An embedding model's pooling as its folder states it; None for other kinds.

        ``mean``, ``cls``, ``max``, ``lasttoken``, ``weightedmean``,
        ``mean_sqrt_len_tokens``; several joined by ``+``.
        """
        ...

    @property
    def normalized(self) -> bool | None:
        """Whether an embedding model's vectors are unit length as it returns them.

        What its folder's own modules return (a ``Normalize`` module last), never
        normalized on top; None for other kinds.
        """
        ...

    @property
    def tokenizer(self) -> Any:
        """The model's fast tokenizer.

        It is not safe to call from two threads at once, and the engine's passes call it:
        a caller from another thread uses a copy of it.
        """
        ...

    def __call__(self, items: Sequence[Any]) -> npt.NDArray[np.float32]:
        """One pass: one row per item, in order.

        Raises:
            TypeError: an item is not of the model's item type.
        """
        ...

    def token_estimate(self, item: Any) -> int:
        """About how many tokens ``item`` takes in a pass, before it is tokenized (cheap)."""
        ...

    def count_tokens(self, items: Sequence[Any]) -> list[int]:
        """Tokens per item as the model sees them (special tokens included, truncated).

        Items of a recent pass are answered from its memory; the others are tokenized.
        """
        ...

    def untruncated_tokens(self, items: Sequence[Any]) -> list[int]:
        """Tokens per item before truncation to the window (special tokens included)."""
        ...

    def measure(self, items: Sequence[Any]) -> list[tuple[int, bool]]:
        """Each item's tokens in a pass and whether truncation cut it, in order."""
        ...

    def statistics(self) -> Statistics:
        """What its passes computed (sub-passes, tokens) and the cost it learned."""
        ...

    def graph_statistics(self) -> dict[str, Any] | None:
        """Its CUDA graphs (held, captured, replayed, eager, why off); None where none run."""
        ...
