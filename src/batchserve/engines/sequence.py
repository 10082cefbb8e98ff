"""Sequence classification models as batch functions: rerankers and classifiers on torch.

:class:`SequenceClassifier` wraps a ``...ForSequenceClassification`` model loaded from a
local folder (as ``CrossEncoder.save`` or ``save_pretrained`` writes it; see
:mod:`batchserve.models.kinds` for how the folder's kind is told). Nothing here downloads
anything.

Theory of operation: one call is one pass. An item is a text (``str``) or a pair (a 2-tuple
of ``str``: a reranker's ``(query, passage)``, or a classifier's two texts). The pass
tokenizes its items together, truncated to the model's window (``longest_first`` for a pair:
the longer side loses tokens first, as ``CrossEncoder.predict`` does), cuts them into
length-sorted sub-passes through the embedders' runner (:mod:`batchserve.engines.passes`:
the pass is padded once, each sub-pass gets its rows and its columns cut to its own longest,
and the runner learns this engine's cost; on a CPU nearly only real tokens are computed, on
a GPU fewer, fuller sub-passes), runs the model on each, and answers one
row of raw logits per item, in the original order: one value
for a reranker, one per label for a classifier. The activation (sigmoid for a reranker,
softmax for a classifier, or none for ``raw_scores``) is the protocol's to apply, so one
pass serves callers who asked for either. A pass that holds both texts and pairs runs as two
sub-passes (a tokenizer pads one shape at a time). Padding never leaks into a result: the
attention mask hides padded positions, so a pair scored in a batch equals the pair scored
alone to float rounding (a tested property).

Each pass remembers its items' token counts and which items lost tokens to truncation, so
the answer's ``usage`` and truncation header cost no second tokenization. The fast tokenizer
is not safe to call from two threads at once, so tokenization holds a lock; the forward pass
does not.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.cuda_graphs import GraphedPasses, cuda_capture, logits_within, mask_4d
from batchserve.engines.passes import PassStatistics, SubPasses, prior
from batchserve.engines.runtime import Runtime, default_threads, place_exported, place_torch
from batchserve.models.kinds import FolderKind, KindName, folder_kind
from batchserve.models.token_counts import estimate_tokens

__all__ = ["EXTRA_HINT", "Pair", "SequenceClassifier", "item_key", "max_sequence_length"]

EXTRA_HINT = (
    "rerankers and classifiers need the 'embeddings' extra: pip install 'batchserve[embeddings]'"
)

#: A reranker's item: (query, passage).
Pair = tuple[str, str]

#: Token counts remembered, as for the embedder's (the most recent items).
_CAPACITY = 16_384


def item_key(item: str | Pair) -> str:
    """A text's own key, or a pair's (its two texts joined by a unit separator)."""
    return item if isinstance(item, str) else item[0] + "\x1f" + item[1]


def max_sequence_length(path: str | Path, tokenizer_max: int | None, positions: int | None) -> int:
    """The model's window in tokens: what the folder states, bounded by what it can hold.

    ``sentence_bert_config.json``'s ``max_seq_length`` if set, else the tokenizer's
    ``model_max_length``; never more than the position embeddings, and 512 when nothing
    sensible is stated (a tokenizer saved without a limit says 10**30).
    """
    stated: int | None = None
    st_config = Path(path) / "sentence_bert_config.json"
    if st_config.is_file():
        with contextlib.suppress(OSError, ValueError):
            value = json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length")
            if isinstance(value, int) and value > 0:
                stated = value
    if stated is None and tokenizer_max is not None and 0 < tokenizer_max < 1_000_000:
        stated = tokenizer_max
    limit = positions if positions is not None and positions > 0 else 512
    return min(stated if stated is not None else 512, limit)


class SequenceClassifier:
    """A sequence classification model as a batch function from items to logit rows.

    Args:
        model: a loaded ``...ForSequenceClassification`` model (on its device, in eval mode).
        tokenizer: its fast tokenizer.
        kind: ``reranker`` (one label) or ``classifier`` (several).
        labels: the label of each logit, in order.
        max_seq_length: the window in tokens; longer inputs are truncated.
        autocast: ``bfloat16`` or ``float16`` to run each pass under ``torch.autocast``.
        run: an exported engine's pass (numpy feeds by input name to logits); None: torch.
        input_names: the exported model's inputs.
        backend, dtype, threads: how an exported engine runs (torch reads its own).
        cuda_graphs: on a CUDA device, replay each sub-pass as a CUDA graph of its shape
            bucket (:mod:`batchserve.engines.cuda_graphs`).

    Calling it blocks for the forward pass (torch releases the GIL): run it in a worker.
    It may be called from several threads at once.

    Attributes:
        kind: ``reranker`` or ``classifier``.
        labels: the label of each logit.
        num_labels: how many logits an item gets.
        device, dtype, threads, backend: how it runs (as for the embedder; ``backend``
            ``torch``, or ``onnx``, ``onnx-int8``, ``openvino`` for an exported engine).
        max_seq_length: the window in tokens.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        kind: KindName,
        labels: Sequence[str],
        max_seq_length: int,
        autocast: str | None = None,
        run: Callable[[dict[str, npt.NDArray[np.int64]]], npt.NDArray[Any]] | None = None,
        input_names: Sequence[str] = (),
        backend: str = "torch",
        dtype: str = "float32",
        threads: int = 1,
        cuda_graphs: bool = False,
    ) -> None:
        import torch

        self._torch = torch
        self._model = model
        self._run = run
        self._input_names = tuple(input_names)
        self.backend = backend
        self._tokenizer = tokenizer
        self.kind = kind
        self.labels = tuple(labels)
        self.num_labels = len(self.labels)
        self.max_seq_length = max_seq_length
        self._tokenize_lock = threading.Lock()
        self._counts: OrderedDict[str, tuple[int, bool]] = OrderedDict()
        self._counts_lock = threading.Lock()
        self._autocast = getattr(torch, autocast) if autocast else None
        if model is not None:
            self.device = str(next(model.parameters()).device)
            weights = str(next(model.parameters()).dtype).removeprefix("torch.")
            self.dtype = f"{autocast}-mixed" if autocast else weights
            self.threads = torch.get_num_threads()
        else:  # an exported engine (ONNX Runtime, OpenVINO) on the CPU
            self.device, self.dtype, self.threads = "cpu", dtype, threads
        #: Runs each pass as length-sorted sub-passes and learns what one costs (as the
        #: embedders do: :mod:`batchserve.engines.passes`).
        self.passes = SubPasses(
            prior(self.device, self.threads),
            left_padded=getattr(tokenizer, "padding_side", "right") == "left",
        )
        #: The passes replayed as CUDA graphs (:mod:`batchserve.engines.cuda_graphs`) on a
        #: CUDA device, unless asked not to, under autocast, or for a model whose attention
        #: is not SDPA's; None where they run eagerly.
        self.graphs: GraphedPasses | None = None
        config = getattr(model, "config", None)
        if (
            cuda_graphs
            and model is not None
            and self.device.startswith("cuda")
            and self._autocast is None
            and getattr(config, "_attn_implementation", None) == "sdpa"
            and not getattr(config, "is_decoder", False)
            and getattr(tokenizer, "padding_side", "right") != "left"
        ):
            half = self.dtype in ("float16", "bfloat16")
            self.graphs = GraphedPasses(
                self._graph_step,
                self._forward_torch_eager,
                device=model.device,
                check=logits_within(0.02 if half else 1e-4),
                capture=cuda_capture(torch.cuda.graph_pool_handle()),
            )
            self.graphs.warm(self._shaped, self.max_seq_length)

    @classmethod
    def from_path(
        cls, path: str | Path, runtime: Runtime | None = None, *, kind: FolderKind | None = None
    ) -> SequenceClassifier:
        """The sequence classification model saved in the folder ``path``, on torch.

        Args:
            path: the model folder (``config.json``, weights, tokenizer files).
            runtime: device, precision and threads (backend ``torch`` or ``auto``).
            kind: the folder's kind, if already read (else read here).

        Raises:
            ConfigError: the folder is not a sequence classification model, or the runtime
                asks for another backend, a device that is not here or a precision the
                machine cannot compute in.
            ImportError: the ``embeddings`` extra is missing.
        """
        from batchserve.errors import ConfigError

        runtime = runtime or Runtime(backend="torch")
        if runtime.backend not in ("torch", "auto"):
            raise ConfigError(
                f"backend {runtime.backend} is not torch: load it with SequenceClassifier.exported"
            )
        kind = kind or folder_kind(path)
        if kind.kind not in ("reranker", "classifier"):
            raise ConfigError(f"{path} is not a sequence classification model ({kind.kind})")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
            from transformers.utils import logging as hf_logging
        except ImportError as exc:
            raise ImportError(EXTRA_HINT) from exc
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        device, dtype = place_torch(runtime)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(str(path), local_files_only=True)
        model.eval()
        model.to(device)
        if dtype in ("float16", "bfloat16"):
            model = model.to(getattr(torch, dtype))
        positions = getattr(model.config, "max_position_embeddings", None)
        window = max_sequence_length(path, getattr(tokenizer, "model_max_length", None), positions)
        return cls(
            model,
            tokenizer,
            kind=kind.kind,
            labels=kind.labels,
            max_seq_length=window,
            autocast=dtype.removesuffix("-mixed") if "mixed" in dtype else None,
            cuda_graphs=runtime.cuda_graphs,
        )

    @classmethod
    def exported(
        cls, path: str | Path, runtime: Runtime, *, kind: FolderKind | None = None
    ) -> SequenceClassifier:
        """The folder ``path`` exported to ``runtime.backend`` (ONNX Runtime or OpenVINO).

        The export is made once into the cache (:func:`batchserve.engines.export.ensure_exported`)
        and not gated here (:func:`batchserve.engines.ranking_gate.gate_sequence` does).

        Raises:
            ConfigError: the folder is not a sequence classification model, or the backend
                is not offered for it.
            ImportError: the backend's extra is missing.
        """
        from transformers import AutoTokenizer

        from batchserve.engines.export import ensure_exported
        from batchserve.engines.exported import _onnx_runner, _openvino_runner
        from batchserve.errors import ConfigError

        kind = kind or folder_kind(path)
        if kind.kind not in ("reranker", "classifier"):
            raise ConfigError(f"{path} is not a sequence classification model ({kind.kind})")
        dtype = place_exported(runtime)
        done = ensure_exported(Path(path), runtime.backend, runtime.cache_path())
        threads = runtime.threads or default_threads()
        runner = _onnx_runner if runtime.backend.startswith("onnx") else _openvino_runner
        run, names = runner(done.model_file, threads, dtype, 1)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        window = max_sequence_length(
            path,
            getattr(tokenizer, "model_max_length", None),
            config.get("max_position_embeddings"),
        )
        return cls(
            None,
            tokenizer,
            kind=kind.kind,
            labels=kind.labels,
            max_seq_length=window,
            run=run,
            input_names=names,
            backend=runtime.backend,
            dtype=dtype,
            threads=threads,
        )

    # -- the pass ----------------------------------------------------------------------------

    def __call__(self, items: Sequence[str | Pair]) -> npt.NDArray[np.float32]:
        """Score ``items`` in one forward pass: one row of ``num_labels`` logits per item.

        Raises:
            TypeError: an item is neither a string nor a pair of strings.
        """
        batch = list(items)
        pairs: list[int] = []
        texts: list[int] = []
        for i, item in enumerate(batch):
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
        out = np.zeros((len(batch), self.num_labels), dtype=np.float32)
        for group in (texts, pairs):
            if group:
                out[group] = self._pass([batch[i] for i in group])
        return out

    def _pass(self, items: list[Any]) -> npt.NDArray[np.float32]:
        # Tokenized once, padded; the shared runner cuts the pass into length-sorted
        # sub-passes (columns cut to each one's longest) and answers in the pass's order.
        tokenizer = self._tokenizer
        tensors = "np" if self._run is not None else "pt"
        with self._tokenize_lock:
            if isinstance(items[0], str):
                enc = tokenizer(
                    items,
                    truncation=True,
                    max_length=self.max_seq_length,
                    padding=True,
                    return_tensors=tensors,
                )
            else:
                enc = tokenizer(
                    [p[0] for p in items],
                    [p[1] for p in items],
                    truncation="longest_first",
                    max_length=self.max_seq_length,
                    padding=True,
                    return_tensors=tensors,
                )
        truncated = [bool(e.overflowing) for e in enc.encodings] if enc.encodings else None
        counts = [int(c) for c in np.asarray(enc["attention_mask"]).sum(axis=1)]
        forward = self._forward_exported if self._run is not None else self._forward_torch
        out = self.passes.run(dict(enc), counts, forward)
        self._remember(items, counts, truncated or [False] * len(items))
        return out

    def _forward_exported(self, features: dict[str, Any]) -> npt.NDArray[np.float32]:
        # One sub-pass on ONNX Runtime or OpenVINO (rows sliced, columns cut: made contiguous).
        assert self._run is not None
        feeds = {n: np.ascontiguousarray(features[n], dtype=np.int64) for n in self._input_names}
        return np.asarray(self._run(feeds), dtype=np.float32)

    def _forward_torch(self, features: dict[str, Any]) -> npt.NDArray[np.float32]:
        # One sub-pass: replayed as its bucket's CUDA graph where there are graphs.
        if self.graphs is not None:
            return self.graphs(features)
        return self._forward_torch_eager(features)

    def _shaped(self, n: int, width: int) -> dict[str, Any]:
        # A sub-pass of exactly n x width tokens, as a pass's tokenizing makes them.
        return dict(
            self._tokenizer(
                ["shape " * width] * n,
                padding="max_length",
                truncation=True,
                max_length=width,
                return_tensors="pt",
            )
        )

    def _graph_step(self, static: dict[str, Any]) -> Any:
        # What a graph captures: the mask handed 4-D, so transformers prepares none.
        kwargs = dict(static)
        kwargs["attention_mask"] = mask_4d(static["attention_mask"])
        return self._model(**kwargs).logits

    def _forward_torch_eager(self, features: dict[str, Any]) -> npt.NDArray[np.float32]:
        # One sub-pass: its features sliced on the CPU, moved to the device here.
        torch = self._torch
        device = self._model.device
        features = {k: v.to(device) for k, v in features.items()}
        with torch.inference_mode(), self._precision():
            logits = self._model(**features).logits
        out: npt.NDArray[np.float32] = logits.float().cpu().numpy()
        return out

    def statistics(self) -> PassStatistics:
        """What this engine's passes computed (sub-passes, tokens) and the cost it learned."""
        return self.passes.statistics()

    def _precision(self) -> Any:
        if self._autocast is None:
            return contextlib.nullcontext()
        return self._torch.autocast(self._model.device.type, dtype=self._autocast)

    # -- token counts ------------------------------------------------------------------------

    def _remember(self, items: list[Any], counts: list[int], truncated: list[bool]) -> None:
        with self._counts_lock:
            table = self._counts
            for item, n, cut in zip(items, counts, truncated, strict=True):
                key = item_key(item)
                table[key] = (n, cut)
                table.move_to_end(key)
            while len(table) > _CAPACITY:
                table.popitem(last=False)

    def token_estimate(self, item: str | Pair) -> int:
        """About how many tokens ``item`` takes in a pass, before it is tokenized (cheap)."""
        if isinstance(item, str):
            return estimate_tokens(item, self.max_seq_length)
        n = estimate_tokens(item[0], 1 << 30) + estimate_tokens(item[1], 1 << 30) - 1
        return min(n, self.max_seq_length)

    def measure(self, items: Sequence[str | Pair]) -> list[tuple[int, bool]]:
        """Each item's tokens in a pass and whether truncation cut it, in order.

        Items scored recently are answered from memory; the others are tokenized (without
        truncation, to tell whether it would cut them).
        """
        out: list[tuple[int, bool] | None] = []
        with self._counts_lock:
            for item in items:
                out.append(self._counts.get(item_key(item)))
        missing = [i for i, v in enumerate(out) if v is None]
        if missing:
            full = self.untruncated_tokens([items[i] for i in missing])
            limit = self.max_seq_length
            for i, n in zip(missing, full, strict=True):
                out[i] = (min(n, limit), n > limit)
        return [v if v is not None else (0, False) for v in out]

    def count_tokens(self, items: Sequence[str | Pair]) -> list[int]:
        """Tokens per item as the model sees them (special tokens included, truncated)."""
        return [n for n, _ in self.measure(items)]

    def untruncated_tokens(self, items: Sequence[str | Pair]) -> list[int]:
        """Tokens per item before truncation (special tokens included): one tokenization."""
        if not items:
            return []
        texts = [i for i, item in enumerate(items) if isinstance(item, str)]
        pairs = [i for i, item in enumerate(items) if not isinstance(item, str)]
        out = [0] * len(items)
        with self._tokenize_lock:
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

    # -- what the tokenizer routes need ------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        """The model's fast tokenizer (call it under :meth:`tokenizing`)."""
        return self._tokenizer

    def tokenizing(self) -> threading.Lock:
        """The lock to hold while calling :attr:`tokenizer` from another thread."""
        return self._tokenize_lock
