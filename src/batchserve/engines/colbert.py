"""Multi-vector (ColBERT) models on an engine: one projected unit vector per kept token.

A ColBERT folder as PyLate saves it (:mod:`batchserve.models.kinds.multivector`) runs as an
:class:`~batchserve.engines.model.EngineModel`: a :class:`TokensHead` composed with a
:class:`~batchserve.engines.runners.TorchRunner` whose step is the transformer's token
states through the folder's ``Dense`` projections. The head follows ``ColBERT.encode``
(PyLate 1.6, ``models/colbert.py``, with the sentence-transformers 5.3 it pins: a text is
stripped and tokenized by the transformer module's ``tokenize``): a text is tokenized to
its length less one (the
marker's place), padded with the ``[MASK]`` token (PyLate pads with it), and the marker's
token is put after the first; a query is padded to ``query_length`` (query expansion) and
attends to its ``[MASK]`` tokens only with ``attend_to_expansion_tokens``; every query
token is kept, a document's padding and skiplist tokens dropped; the kept vectors are
scaled to unit length. Queries and documents are tokenized apart (their own lengths), in
one pass, as length-sorted sub-passes like every kind's.

Only torch runs it: no exported engine is gated for per-token vectors, so ``auto`` picks
torch and an exported backend named on purpose is refused (:func:`on_torch`'s caller,
:mod:`batchserve.engines.loader`).
"""

from __future__ import annotations

import json
import os
import string
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.cuda_graphs import Check, cosine_within
from batchserve.engines.model import EngineModel
from batchserve.engines.runners import TorchRunner
from batchserve.engines.runtime import Runtime, place_torch
from batchserve.errors import ConfigError
from batchserve.models.kinds import MULTIVECTOR, Kind, Marked
from batchserve.models.kinds.multivector import pack
from batchserve.models.token_counts import estimate_tokens

__all__ = ["ColbertSettings", "TokensHead", "on_torch"]


class ColbertSettings:
    """A ColBERT folder's settings, as PyLate reads them (its defaults where unstated).

    Args:
        config: ``config_sentence_transformers.json``'s object.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        def pick(key: str, default: Any) -> Any:
            value = config.get(key)
            return default if value is None else value

        self.query_prefix: str = str(pick("query_prefix", "[Q] "))
        self.document_prefix: str = str(pick("document_prefix", "[D] "))
        self.query_length: int = int(pick("query_length", 32))
        self.document_length: int = int(pick("document_length", 180))
        self.expansion: bool = bool(pick("do_query_expansion", True))
        self.attend: bool = bool(pick("attend_to_expansion_tokens", False)) and self.expansion
        self.skiplist_words: list[str] = list(pick("skiplist_words", list(string.punctuation)))


class TokensHead:
    """A ColBERT model's head: marked texts in, each one's kept token vectors out (packed).

    Args:
        tokenizer: the folder's fast tokenizer (its padding token set to ``[MASK]``).
        settings: the folder's ColBERT settings.
        dimension: a token vector's length (the last projection's).
        positions: the transformer's position embeddings (a bound on both lengths).
    """

    kind: Kind = MULTIVECTOR
    labels: tuple[str, ...] = ()
    pooling = None
    normalized = True
    left_padded = False

    def __init__(
        self, tokenizer: Any, settings: ColbertSettings, *, dimension: int, positions: int
    ) -> None:
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self.settings = settings
        self.dimension = dimension
        self.query_length = min(settings.query_length, positions)
        self.window = min(settings.document_length, positions)
        self._longest = max(self.query_length, self.window)
        self._prefix = {
            True: _marker_id(tokenizer, settings.query_prefix),
            False: _marker_id(tokenizer, settings.document_prefix),
        }
        ids = [tokenizer.convert_tokens_to_ids(w) for w in settings.skiplist_words]
        self._skip = np.asarray([i for i in ids if i is not None], dtype=np.int64)

    @property
    def width(self) -> int:
        """A packed row's length: room for the longest item's vectors."""
        return 2 + self._longest * self.dimension

    @property
    def tokenizer(self) -> Any:
        """The folder's fast tokenizer."""
        return self._tokenizer

    def groups(self, items: Sequence[Any]) -> list[list[int]]:
        """The queries, then the documents (each tokenized to its own length).

        Raises:
            TypeError: an item is neither a string (a document) nor a marked text.
        """
        queries: list[int] = []
        documents: list[int] = []
        for i, item in enumerate(items):
            if isinstance(item, Marked) and isinstance(item.text, str):
                (queries if item.query else documents).append(i)
            elif isinstance(item, str):
                documents.append(i)
            else:
                raise TypeError(f"input {i} must be a string, got {type(item).__name__}")
        return [group for group in (queries, documents) if group]

    def tokenize(self, items: Sequence[Any]) -> tuple[dict[str, Any], list[int]]:
        """One group's features, PyLate's way, and each item's tokens in the pass.

        A query group's counts are its full length (its ``[MASK]`` tokens are kept), so
        no sub-pass cuts them.
        """
        query = _is_query(items[0])
        texts = [_text(item).strip() for item in items]  # as sentence-transformers 5 does
        length = self.query_length if query else self.window
        prefix = self._prefix[query]
        limit = length - 1 if prefix is not None else length
        expand = query and self.settings.expansion
        with self._lock:
            enc = self._tokenizer(
                texts,
                truncation=True,
                max_length=limit,
                padding="max_length" if expand else True,
                return_tensors="np",
            )
        features: dict[str, Any] = {
            name: np.asarray(value, dtype=np.int64) for name, value in enc.items()
        }
        if prefix is not None:
            for name, fill in (("input_ids", prefix), ("attention_mask", 1), ("token_type_ids", 0)):
                if name in features:
                    value = features[name]
                    column = np.full((value.shape[0], 1), fill, dtype=np.int64)
                    features[name] = np.concatenate([value[:, :1], column, value[:, 1:]], axis=1)
        if query and self.settings.attend:
            features["attention_mask"] = np.ones_like(features["attention_mask"])
        features["is_query"] = query
        if expand:
            counts = [features["input_ids"].shape[1]] * len(items)
        else:
            counts = [int(c) for c in features["attention_mask"].sum(axis=1)]
        return features, counts

    def finish(
        self, raw: npt.NDArray[np.float32], features: Mapping[str, Any]
    ) -> npt.NDArray[np.float32]:
        """Each item's kept token vectors, unit length, packed one row per item."""
        ids = np.asarray(features["input_ids"])
        mask = np.asarray(features["attention_mask"]).astype(bool)
        if features.get("is_query"):
            keep = np.ones_like(mask) if self.settings.expansion else mask
        else:
            keep = mask & ~np.isin(ids, self._skip)
        out = np.empty((raw.shape[0], self.width), dtype=np.float32)
        for i in range(raw.shape[0]):
            vectors = raw[i][keep[i]]
            norms = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            out[i] = pack((vectors / norms).astype(np.float32), self.width)
        return out

    def count(self, items: Sequence[Any]) -> list[int]:
        """Tokens per item as a pass sees them (a query: its full length when expanded)."""
        out = []
        for item, n in zip(items, self.untruncated(items), strict=True):
            if _is_query(item):
                out.append(
                    self.query_length if self.settings.expansion else min(n, self.query_length)
                )
            else:
                out.append(min(n, self.window))
        return out

    def untruncated(self, items: Sequence[Any]) -> list[int]:
        """Tokens per item before truncation (its marker and special tokens included)."""
        if not items:
            return []
        with self._lock:
            enc = self._tokenizer([_text(item).strip() for item in items], add_special_tokens=True)
        return [len(ids) + 1 for ids in enc["input_ids"]]

    def estimate(self, item: Any) -> int:
        """About how many tokens the item takes (its characters; a query: its length)."""
        if _is_query(item):
            return self.query_length
        return estimate_tokens(_text(item), self.window)

    def key(self, item: Any) -> str:
        """The text, marked as a query's or a document's."""
        return ("\x1eQ" if _is_query(item) else "\x1eD") + _text(item)

    def shaped(self, n: int, width: int) -> dict[str, Any]:
        """``n`` documents of ``width`` tokens (never captured: runs eagerly)."""
        features, _ = self.tokenize(["shape " * width] * n)
        return features

    def check(self, half: bool) -> Check:
        """Each row's cosine to its eager one."""
        return cosine_within(0.999 if half else 0.9999)


def _is_query(item: Any) -> bool:
    return isinstance(item, Marked) and item.query


def _text(item: Any) -> str:
    return item.text if isinstance(item, Marked) else str(item)


def _marker_id(tokenizer: Any, marker: str) -> int | None:
    # PyLate puts the marker's token id in (an empty marker: none).
    if not marker:
        return None
    token = tokenizer.convert_tokens_to_ids(marker)
    if token is None or token == tokenizer.unk_token_id:
        raise ConfigError(f"the ColBERT marker {marker!r} is not a token of the folder's tokenizer")
    return int(token)


def settings_of(path: str | Path) -> ColbertSettings:
    """The ColBERT settings ``config_sentence_transformers.json`` in ``path`` states."""
    file = Path(path) / "config_sentence_transformers.json"
    config = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    return ColbertSettings(config if isinstance(config, dict) else {})


def on_torch(path: str | Path, runtime: Runtime | None = None) -> EngineModel:
    """The ColBERT folder ``path`` on torch: its transformer and ``Dense`` projections.

    Raises:
        ConfigError: the runtime names another backend, or a module is not PyLate's.
        ImportError: the ``embeddings`` extra is missing.
    """
    runtime = runtime or Runtime(backend="torch")
    if runtime.backend not in ("torch", "auto"):
        raise ConfigError(
            f"backend {runtime.backend} does not run a multi-vector (ColBERT) model: no "
            "exported engine is gated for per-token vectors; serve it with backend=torch "
            "(or auto, which picks torch)"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    folder = Path(path)
    device, dtype = place_torch(runtime)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if tokenizer.mask_token_id is not None:  # PyLate pads with [MASK] (else end of text)
        tokenizer.pad_token = tokenizer.mask_token
    elif tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModel.from_pretrained(str(folder), local_files_only=True)
    layers = []
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    for module in modules[1:]:
        sub = folder / str(module.get("path", ""))
        config = json.loads((sub / "config.json").read_text(encoding="utf-8"))
        if config.get("use_residual") or not str(config.get("activation_function", "")).endswith(
            "Identity"
        ):
            raise ConfigError(
                f"{sub}: a Dense projection with an activation or a residual, which "
                "batchserve does not run"
            )
        linear = torch.nn.Linear(
            int(config["in_features"]), int(config["out_features"]), bias=bool(config["bias"])
        )
        weights = sub / "model.safetensors"
        state = (
            load_file(str(weights))
            if weights.is_file()
            else torch.load(str(sub / "pytorch_model.bin"), map_location="cpu")
        )
        linear.load_state_dict({k.removeprefix("linear."): v for k, v in state.items()})
        layers.append(linear)
    net = _Colbert(model, torch.nn.Sequential(*layers)).eval().to(device)
    if dtype in ("float16", "bfloat16"):
        net = net.to(getattr(torch, dtype))
    positions = int(getattr(model.config, "max_position_embeddings", 512) or 512)
    dimension = layers[-1].out_features if layers else int(model.config.hidden_size)
    head = TokensHead(tokenizer, settings_of(folder), dimension=dimension, positions=positions)
    runner = TorchRunner(
        net, _step, autocast=dtype.removesuffix("-mixed") if "mixed" in dtype else None
    )
    return EngineModel(runner, head)


def _step(model: Any, inputs: dict[str, Any]) -> Any:
    return model(inputs)


def _module() -> Any:
    import torch

    class Colbert(torch.nn.Module):
        def __init__(self, transformer: Any, projection: Any) -> None:
            super().__init__()
            self.transformer = transformer
            self.projection = projection

        @property
        def device(self) -> Any:
            return next(self.parameters()).device

        def forward(self, inputs: dict[str, Any]) -> Any:
            states = self.transformer(**inputs).last_hidden_state
            return self.projection(states)

    return Colbert


def _Colbert(transformer: Any, projection: Any) -> Any:
    return _module()(transformer, projection)
