"""One head per kind of model: what an item is, how it is tokenized, what a row means.

A head is the half of a model on an engine that its kind decides; the runner
(:mod:`batchserve.engines.runners`) is the half its runtime decides, and
:class:`~batchserve.engines.model.EngineModel` composes the two. A head checks the items of
a pass and groups those tokenized together, tokenizes them (numpy features, padded to the
group's longest, and each item's tokens), turns the runner's raw rows into the answer's
rows, and counts an item's tokens without a pass.

* :class:`VectorHead`: an embedding model. An item is a text; the folder's text pipeline
  (:class:`~batchserve.engines.pipeline.TextPipeline`) tokenizes it as sentence-transformers
  does, and pools the runner's token embeddings into the folder's vector (``Dense`` and
  ``Normalize`` where the folder has them).
* :class:`LogitsHead`: a sequence classification model (a reranker, a classifier). An item
  is a text or a pair (a 2-tuple of texts: a reranker's ``(query, passage)``); a pair is
  truncated ``longest_first`` (the longer side loses tokens first, as
  ``CrossEncoder.predict`` does); texts and pairs are tokenized apart (a tokenizer pads one
  shape at a time). The runner's rows are the logits, raw: the activation (sigmoid,
  softmax, or none for ``raw_scores``) is the protocol's to apply, so one pass serves
  callers who asked for either.

Thread-safety: a fast tokenizer is not safe to call from two threads at once (it mutates
its padding and truncation state), so each head tokenizes under a lock (the pipeline's, or
its own).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from batchserve.engines.cuda_graphs import Check, cosine_within, logits_within
from batchserve.engines.pipeline import Preprocess, TextPipeline
from batchserve.models.kinds import EMBEDDING, Kind
from batchserve.models.token_counts import estimate_tokens

__all__ = ["Head", "LogitsHead", "Pair", "VectorHead", "item_key"]

#: A sequence classification model's pair item: (query, passage), or two texts.
Pair = tuple[str, str]


def item_key(item: str | Pair) -> str:
    """A text's own key, or a pair's (its two texts joined by a unit separator)."""
    return item if isinstance(item, str) else item[0] + "\x1f" + item[1]


class Head(Protocol):
    """What a kind's half of a model on an engine does (see the module docstring)."""

    @property
    def kind(self) -> Kind:
        """The model's kind (:mod:`batchserve.models.kinds`)."""
        ...

    @property
    def width(self) -> int:
        """A row's length: a vector's dimension, or one logit per label."""
        ...

    @property
    def window(self) -> int:
        """The window in tokens; longer items are truncated to it."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The model's fast tokenizer."""
        ...

    @property
    def left_padded(self) -> bool:
        """The tokenizer pads on the left."""
        ...

    @property
    def labels(self) -> tuple[str, ...]:
        """The label of each logit (none for a vector)."""
        ...

    @property
    def pooling(self) -> str | None:
        """A vector's pooling as the folder states it (None for logits)."""
        ...

    @property
    def normalized(self) -> bool | None:
        """Whether a vector is unit length (None for logits)."""
        ...

    def groups(self, items: Sequence[Any]) -> list[list[int]]:
        """The items' indices in the groups tokenized together (none for no items).

        Raises:
            TypeError: an item is not of this kind's item type.
        """
        ...

    def tokenize(self, items: Sequence[Any]) -> tuple[dict[str, Any], list[int]]:
        """One group's features (numpy, padded to its longest item) and each item's tokens."""
        ...

    def finish(
        self, raw: npt.NDArray[np.float32], features: Mapping[str, Any]
    ) -> npt.NDArray[np.float32]:
        """A sub-pass's answer rows from the runner's raw rows (its features cut alike)."""
        ...

    def count(self, items: Sequence[Any]) -> list[int]:
        """Tokens per item as a pass sees them (special tokens included, truncated)."""
        ...

    def untruncated(self, items: Sequence[Any]) -> list[int]:
        """Tokens per item before truncation (special tokens included)."""
        ...

    def estimate(self, item: Any) -> int:
        """About how many tokens ``item`` takes in a pass, before it is tokenized (cheap)."""
        ...

    def key(self, item: Any) -> str:
        """The key its token count is remembered by."""
        ...

    def shaped(self, n: int, width: int) -> dict[str, Any]:
        """A sub-pass of exactly ``n`` x ``width`` tokens: what a CUDA graph is captured on."""
        ...

    def check(self, half: bool) -> Check:
        """How close a CUDA graph's rows must be to the eager ones (``half``: 16-bit weights)."""
        ...


class VectorHead:
    """An embedding model's head: texts in, the folder's vectors out.

    Args:
        pipeline: the folder's text pipeline (tokenizing, pooling, ``Dense``, ``Normalize``).
        preprocess: the library's own ``preprocess``, for a folder it renders through a
            chat template (only the torch engine has it); None otherwise.

    Attributes:
        pipeline: the :class:`~batchserve.engines.pipeline.TextPipeline`.
    """

    kind = EMBEDDING
    labels: tuple[str, ...] = ()

    def __init__(self, pipeline: TextPipeline, *, preprocess: Preprocess | None = None) -> None:
        self.pipeline = pipeline
        self._preprocess = preprocess

    @property
    def width(self) -> int:
        """A vector's length."""
        return self.pipeline.dimension

    @property
    def window(self) -> int:
        """The window in tokens."""
        return self.pipeline.window

    @property
    def tokenizer(self) -> Any:
        """The folder's tokenizer (the pipeline's)."""
        return self.pipeline.tokenizer

    @property
    def left_padded(self) -> bool:
        """The tokenizer pads on the left (a decoder's last token is a real one)."""
        return self.pipeline.padding_side == "left"

    @property
    def pooling(self) -> str:
        """The folder's pooling (``mean``, ``cls``, ``lasttoken``...)."""
        return self.pipeline.pooling

    @property
    def normalized(self) -> bool:
        """Whether its vectors are unit length (the folder ends in ``Normalize``)."""
        return self.pipeline.normalized

    def groups(self, items: Sequence[Any]) -> list[list[int]]:
        """All the texts in one group.

        Raises:
            TypeError: an input is not a string.
        """
        for i, text in enumerate(items):
            if not isinstance(text, str):
                raise TypeError(f"input {i} must be a string, got {type(text).__name__}")
        return [list(range(len(items)))] if items else []

    def tokenize(self, items: Sequence[Any]) -> tuple[dict[str, Any], list[int]]:
        """The texts' features, as the pipeline tokenizes them, and each text's tokens."""
        return self.pipeline.tokenize(items, preprocess=self._preprocess)

    def finish(
        self, raw: npt.NDArray[np.float32], features: Mapping[str, Any]
    ) -> npt.NDArray[np.float32]:
        """The token embeddings pooled by the pipeline."""
        return self.pipeline.pool(raw, dict(features))

    def count(self, items: Sequence[Any]) -> list[int]:
        """Tokens per text, tokenized as a pass does."""
        return self.pipeline.count(items, preprocess=self._preprocess)

    def untruncated(self, items: Sequence[Any]) -> list[int]:
        """Tokens per text before truncation to the window."""
        return self.pipeline.untruncated(items)

    def estimate(self, item: Any) -> int:
        """About how many tokens the text takes (its characters)."""
        return estimate_tokens(item, self.pipeline.window)

    def key(self, item: Any) -> str:
        """The text itself."""
        return cast(str, item)

    def shaped(self, n: int, width: int) -> dict[str, Any]:
        """``n`` long texts' first ``width`` tokens, with the keys a pass's features have."""
        features, _ = self.tokenize(["shape " * (2 * width)] * n)
        out: dict[str, Any] = {}
        for name, value in features.items():
            if getattr(value, "ndim", 0) == 2:
                value = np.ascontiguousarray(value[:, :width])
                if value.shape[1] < width:  # a window narrower than the bucket
                    value = np.pad(value, ((0, 0), (0, width - value.shape[1])))
            out[name] = value
        out["attention_mask"] = np.ones_like(out["attention_mask"])
        return out

    def check(self, half: bool) -> Check:
        """Each graphed item's cosine to its eager one (a looser bound at 16 bits)."""
        return cosine_within(0.999 if half else 0.9999)


class LogitsHead:
    """A sequence classification model's head: texts or pairs in, one logit per label out.

    Args:
        tokenizer: the model's fast tokenizer.
        kind: the model's kind: a reranker (one label) or a classifier (several).
        labels: the label of each logit, in order.
        window: the window in tokens; longer items are truncated.
    """

    pooling = None
    normalized = None

    def __init__(self, tokenizer: Any, *, kind: Kind, labels: Sequence[str], window: int) -> None:
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self.kind = kind
        self.labels = tuple(labels)
        self.window = window

    @property
    def width(self) -> int:
        """One logit per label."""
        return len(self.labels)

    @property
    def tokenizer(self) -> Any:
        """The model's fast tokenizer."""
        return self._tokenizer

    @property
    def left_padded(self) -> bool:
        """The tokenizer pads on the left."""
        return getattr(self._tokenizer, "padding_side", "right") == "left"

    def groups(self, items: Sequence[Any]) -> list[list[int]]:
        """The texts, then the pairs (each group tokenized alone).

        Raises:
            TypeError: an item is neither a string nor a pair of strings.
        """
        pairs: list[int] = []
        texts: list[int] = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                texts.append(i)
            elif (
                isinstance(item, tuple)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], str)
            ):
                pairs.append(i)
            else:
                raise TypeError(
                    f"input {i} must be a string or a pair of strings, got {type(item).__name__}"
                )
        return [group for group in (texts, pairs) if group]

    def tokenize(self, items: Sequence[Any]) -> tuple[dict[str, Any], list[int]]:
        """Texts or pairs (one or the other), truncated to the window and padded."""
        with self._lock:
            if isinstance(items[0], str):
                enc = self._tokenizer(
                    list(items),
                    truncation=True,
                    max_length=self.window,
                    padding=True,
                    return_tensors="np",
                )
            else:
                enc = self._tokenizer(
                    [p[0] for p in items],
                    [p[1] for p in items],
                    truncation="longest_first",
                    max_length=self.window,
                    padding=True,
                    return_tensors="np",
                )
        features = {name: np.asarray(value, dtype=np.int64) for name, value in enc.items()}
        counts = [int(c) for c in features["attention_mask"].sum(axis=1)]
        return features, counts

    def finish(
        self, raw: npt.NDArray[np.float32], features: Mapping[str, Any]
    ) -> npt.NDArray[np.float32]:
        """The logits as the runner answers them (raw: the protocol activates them)."""
        return raw

    def count(self, items: Sequence[Any]) -> list[int]:
        """Tokens per item, from one tokenization without truncation, capped at the window."""
        return [min(n, self.window) for n in self.untruncated(items)]

    def untruncated(self, items: Sequence[Any]) -> list[int]:
        """Tokens per item before truncation: one tokenization per shape (texts, pairs)."""
        if not items:
            return []
        texts = [i for i, item in enumerate(items) if isinstance(item, str)]
        pairs = [i for i, item in enumerate(items) if not isinstance(item, str)]
        out = [0] * len(items)
        with self._lock:
            if texts:
                enc = self._tokenizer([items[i] for i in texts], add_special_tokens=True)
                for i, ids in zip(texts, enc["input_ids"], strict=True):
                    out[i] = len(ids)
            if pairs:
                firsts = [items[i][0] for i in pairs]
                seconds = [items[i][1] for i in pairs]
                enc = self._tokenizer(firsts, seconds, add_special_tokens=True)
                for i, ids in zip(pairs, enc["input_ids"], strict=True):
                    out[i] = len(ids)
        return out

    def estimate(self, item: Any) -> int:
        """About how many tokens the text or pair takes (its characters)."""
        if isinstance(item, str):
            return estimate_tokens(item, self.window)
        n = estimate_tokens(item[0], 1 << 30) + estimate_tokens(item[1], 1 << 30) - 1
        return min(n, self.window)

    def key(self, item: Any) -> str:
        """The text, or the pair's two texts joined (:func:`item_key`)."""
        return item_key(item)

    def shaped(self, n: int, width: int) -> dict[str, Any]:
        """``n`` texts of exactly ``width`` tokens, as a pass's tokenizing makes them."""
        enc = self._tokenizer(
            ["shape " * width] * n,
            padding="max_length",
            truncation=True,
            max_length=width,
            return_tensors="np",
        )
        return {name: np.asarray(value, dtype=np.int64) for name, value in enc.items()}

    def check(self, half: bool) -> Check:
        """No logit moved by more than a tolerance (a looser one at 16 bits)."""
        return logits_within(0.02 if half else 1e-4)
