"""A model on an engine: a runner of its runtime composed with a head of its kind.

:class:`EngineModel` is every model batchserve runs on an engine, whatever its runtime
(:mod:`batchserve.engines.runners`: torch; ONNX Runtime or OpenVINO) and its kind
(:mod:`batchserve.engines.heads`: an embedding model's vectors, a sequence classification
model's logits). It states :class:`batchserve.models.engine.Engine`, what the server may
ask of it. The kinds' modules build one: :mod:`batchserve.engines.embeddings`,
:mod:`batchserve.engines.sequence`.

Theory of operation: one call is one pass. The head checks the items and groups those
tokenized together (all of an embedding model's texts; a sequence model's texts, then its
pairs), and tokenizes each group once, padded to its longest item. The pass runs as
length-sorted sub-passes (:class:`~batchserve.engines.passes.SubPasses`: rows sliced,
columns cut to each sub-pass's longest, rows scattered back in order, the engine's own cost
learned from their timings): the runner answers each sub-pass's raw rows and the head turns
them into the answer's (pooled vectors, or the logits as they are). Padding never leaks
into a result: the attention mask hides padded positions, so an item computed in a batch
equals the item computed alone to float rounding, whatever the other items' lengths (a
tested property).

The tokens of each pass's items (from its attention mask) are remembered
(:class:`~batchserve.models.token_counts.TokenCounts`, keyed by the head), so the answer's
``usage`` and the truncation count right after a pass cost no second tokenization.

Thread-safety: it may be called from several threads at once: the head tokenizes under its
lock, the runner's passes do not take one, and the sub-passes' cost model and the token
memory are updated under their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.cuda_graphs import GraphedPasses
from batchserve.engines.heads import Head
from batchserve.engines.passes import PassStatistics, SubPasses, prior
from batchserve.engines.runners import Runner
from batchserve.models.kinds import Kind
from batchserve.models.token_counts import TokenCounts

__all__ = ["EngineModel"]


class EngineModel:
    """A model on an engine, as a batch function from items to float32 rows.

    Args:
        runner: runs a sub-pass on the model's runtime.
        head: the model's kind: its items, tokenizing and rows.
        library: the library's own model where the engine runs it (a torch embedding
            model's ``SentenceTransformer``: what the edges gate holds the engine to);
            None otherwise.

    Calling it blocks for the pass: run it in a worker. It may be called from several
    threads at once.

    Attributes:
        runner: the :class:`~batchserve.engines.runners.Runner`.
        head: the :class:`~batchserve.engines.heads.Head`.
        library: as above.
        passes: its :class:`~batchserve.engines.passes.SubPasses` (the plan's bounds, the
            learned cost; :meth:`statistics` reads it).
        gate: the gate's figures, when the loader gated it (None otherwise).
    """

    def __init__(self, runner: Runner, head: Head, *, library: Any = None) -> None:
        self.runner = runner
        self.head = head
        self.library = library
        grid = runner.grid if not head.left_padded else None
        pad_id = (getattr(head.tokenizer, "pad_token_id", None) or 0) if grid is not None else 0
        self.passes = SubPasses(
            prior(runner.device, runner.threads),
            left_padded=head.left_padded,
            grid=grid,
            window=head.window,
            pad_id=pad_id,
        )
        self.gate: dict[str, Any] | None = None
        self._counts = TokenCounts()

    # -- what it is ------------------------------------------------------------------------

    @property
    def kind(self) -> Kind:
        """Its kind (:mod:`batchserve.models.kinds`): an embedder, a reranker or a classifier."""
        return self.head.kind

    @property
    def backend(self) -> str:
        """``torch``, ``onnx``, ``onnx-int8``, ``openvino`` or ``openvino-int8``."""
        return self.runner.backend

    @property
    def device(self) -> str:
        """Where the passes run (``cpu``, ``cuda:N``, ``mps``)."""
        return self.runner.device

    @property
    def dtype(self) -> str:
        """The precision (``float32``, ``bfloat16``, ``int8``, ``bfloat16-mixed``...)."""
        return self.runner.dtype

    @property
    def threads(self) -> int:
        """CPU threads per pass."""
        return self.runner.threads

    @property
    def dimension(self) -> int:
        """A row's length: a vector's dimension, or one logit per label."""
        return self.head.width

    @property
    def labels(self) -> tuple[str, ...]:
        """The label of each logit (none for an embedding model)."""
        return self.head.labels

    @property
    def num_labels(self) -> int:
        """How many logits an item gets (0 for an embedding model)."""
        return len(self.head.labels)

    @property
    def max_seq_length(self) -> int:
        """The window in tokens (longer items are truncated)."""
        return self.head.window

    @property
    def pooling(self) -> str | None:
        """An embedding model's pooling (``mean``, ``cls``, ``lasttoken``...); None otherwise."""
        return self.head.pooling

    @property
    def normalized(self) -> bool | None:
        """Whether an embedding model's vectors are unit length; None for other kinds."""
        return self.head.normalized

    @property
    def tokenizer(self) -> Any:
        """The model's fast tokenizer (the head calls it under its lock)."""
        return self.head.tokenizer

    @property
    def graphs(self) -> GraphedPasses | None:
        """Its passes replayed as CUDA graphs; None where they run eagerly."""
        return self.runner.graphs

    # -- the pass ----------------------------------------------------------------------------

    def __call__(self, items: Sequence[Any]) -> npt.NDArray[np.float32]:
        """One pass (length-sorted sub-passes): one row per item, in order.

        Raises:
            TypeError: an item is not of the model's item type.
        """
        rows, _ = self.embed(items)
        return rows

    def embed(self, items: Sequence[Any]) -> tuple[npt.NDArray[np.float32], list[int]]:
        """One pass; also each item's tokens (special tokens included, after truncation).

        Returns:
            An array of shape ``(len(items), dimension)`` and the tokens per item.

        Raises:
            TypeError: an item is not of the model's item type.
        """
        batch = list(items)
        groups = self.head.groups(batch)
        if len(groups) == 1:  # the usual pass: every item in one group, in order
            return self._run(batch)
        out = np.zeros((len(batch), self.head.width), dtype=np.float32)
        counts = [0] * len(batch)
        for group in groups:
            rows, tokens = self._run([batch[i] for i in group])
            out[group] = rows
            for i, n in zip(group, tokens, strict=True):
                counts[i] = n
        return out, counts

    def _run(self, items: list[Any]) -> tuple[npt.NDArray[np.float32], list[int]]:
        # One group: tokenized once, padded; the runner answers in the group's order.
        features, counts = self.head.tokenize(items)
        rows = self.passes.run(features, counts, self.forward)
        self._counts.remember([self.head.key(item) for item in items], counts)
        return rows, counts

    def features(self, items: Sequence[Any]) -> tuple[dict[str, Any], list[int]]:
        """One group's features, as the head tokenizes it, and each item's tokens."""
        return self.head.tokenize(items)

    def forward(self, features: Mapping[str, Any]) -> npt.NDArray[np.float32]:
        """One sub-pass: the runner's raw rows through the head."""
        return self.head.finish(self.runner(features), features)

    def statistics(self) -> PassStatistics:
        """What its passes computed (sub-passes, tokens) and the cost it learned."""
        return self.passes.statistics()

    def graph_statistics(self) -> dict[str, Any] | None:
        """Its CUDA graphs' figures; None where the passes run eagerly."""
        graphs = self.runner.graphs
        return graphs.statistics() if graphs is not None else None

    # -- token counts ------------------------------------------------------------------------

    def token_estimate(self, item: Any) -> int:
        """About how many tokens ``item`` takes in a pass, before it is tokenized (cheap)."""
        return self.head.estimate(item)

    def count_tokens(self, items: Sequence[Any]) -> list[int]:
        """Tokens per item as the model sees them (special tokens included, truncated).

        Items of a recent pass are answered from memory; the others are tokenized.
        """
        known = self._counts.recall([self.head.key(item) for item in items])
        missing = [i for i, n in enumerate(known) if n is None]
        if missing:
            counted = self.head.count([items[i] for i in missing])
            for i, n in zip(missing, counted, strict=True):
                known[i] = n
        return [n or 0 for n in known]

    def untruncated_tokens(self, items: Sequence[Any]) -> list[int]:
        """Tokens per item before truncation to the window (special tokens included)."""
        return self.head.untruncated(items) if items else []

    def measure(self, items: Sequence[Any]) -> list[tuple[int, bool]]:
        """Each item's tokens in a pass and whether truncation cut it, in order.

        Counted as :meth:`count_tokens` counts; an item that fills the window is tokenized
        again, without truncation, to tell a cut item from one of exactly the window.
        """
        counts = self.count_tokens(items)
        window = self.head.window
        full = [i for i, n in enumerate(counts) if n >= window]
        cut = [False] * len(counts)
        if full:
            for i, n in zip(full, self.head.untruncated([items[i] for i in full]), strict=True):
                cut[i] = n > window
        return list(zip(counts, cut, strict=True))
