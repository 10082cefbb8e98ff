"""Sparse embedders on an engine: SPLADE, one weight per vocabulary term, on torch.

A sparse folder (see :mod:`batchserve.models.kinds.sparse` for how it is told) runs as an
:class:`~batchserve.engines.model.EngineModel`: a :class:`SpladeHead` (an item is a text,
tokenized as sentence-transformers tokenizes it, prompts included) composed with a
:class:`~batchserve.engines.runners.TorchRunner` whose step is the masked-LM transformer
and the folder's ``SpladePooling`` on the device: the logits times the attention mask, then
``log1p(relu(.))`` (``log1p`` twice for ``log1p_relu``), then the max or sum over tokens,
the operations ``SpladePooling.forward`` runs, in its order. Pooling on the device keeps a
sub-pass's ``tokens x vocabulary`` logits off the CPU; a row is the vocabulary's width.

Padding never leaks into a row: a padded position's logits are zeroed before the
activation, so it adds zero to a sum and never raises a max (every activated value is at
least zero); a text in a batch gets the row it gets alone.

Only torch: no gate judges an exported engine's sparse rows yet, so ``--backend auto``
loads torch and an exported backend is refused (:func:`on_torch`).

What is read: ``modules.json`` (a ``Transformer`` of task ``fill-mask`` or an
``MLMTransformer``, then ``SpladePooling``), the pooling's ``config.json``
(``pooling_strategy``: ``max`` or ``sum``; ``activation_function``: ``relu`` or
``log1p_relu``), the transformer's window, tokenizer and lower-casing as
:func:`~batchserve.engines.pipeline.transformer_tokenizer` reads an embedding folder's,
and the named prompts; a bare ``...ForMaskedLM`` folder (``--pooling splade``) is what
``SparseEncoder(folder)`` builds for it: the transformer, ``max`` pooling, ``relu``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.cuda_graphs import Check, logits_within
from batchserve.engines.heads import VectorHead
from batchserve.engines.model import EngineModel
from batchserve.engines.pipeline import TextPipeline, transformer_tokenizer
from batchserve.engines.runners import TorchRunner
from batchserve.engines.runtime import Runtime, place_torch
from batchserve.errors import ConfigError
from batchserve.models.kinds import SPARSE, folder_prompts

__all__ = ["EXTRA_HINT", "Splade", "SpladeHead", "on_torch", "read_splade"]

EXTRA_HINT = "sparse embedders need the 'embeddings' extra: pip install 'batchserve[embeddings]'"

#: ``SpladePooling``'s pooling strategies and activations.
_STRATEGIES = ("max", "sum")
_ACTIVATIONS = ("relu", "log1p_relu")


@dataclass(frozen=True, slots=True, kw_only=True)
class Splade:
    """A sparse folder's files, read once: where its transformer is and how it pools.

    Attributes:
        folder: the model folder.
        transformer: the transformer's folder (its weights, config and tokenizer).
        strategy: ``max`` or ``sum`` over tokens.
        activation: ``relu`` (``log1p(relu(x))``) or ``log1p_relu`` (``log1p`` twice).
    """

    folder: Path
    transformer: Path
    strategy: str = "max"
    activation: str = "relu"


def read_splade(path: str | Path) -> Splade:
    """Where the sparse folder ``path`` keeps its transformer, and its SPLADE pooling.

    Raises:
        ConfigError: modules other than a masked-LM transformer then ``SpladePooling``, a
            transformer task other than ``fill-mask``, or a pooling batchserve does not know.
    """
    folder = Path(path)
    listing = folder / "modules.json"
    if not listing.is_file():
        return Splade(folder=folder, transformer=folder)
    entries = _read_json(listing)
    if not isinstance(entries, list):
        raise ConfigError(f"{listing} must hold a JSON list")
    modules = sorted(
        (m for m in entries if isinstance(m, dict)), key=lambda m: int(m.get("idx", 0))
    )
    types = [str(m.get("type", "")).rpartition(".")[2] for m in modules]
    if (
        len(types) != 2
        or types[0] not in ("Transformer", "MLMTransformer")
        or (types[1] != "SpladePooling")
    ):
        raise ConfigError(
            f"{listing}: modules {', '.join(types)}; a sparse encoder is served as a masked-LM "
            "Transformer (or MLMTransformer) then SpladePooling"
        )
    transformer = folder / str(modules[0].get("path") or "")
    task = _st_config(transformer).get("transformer_task", "fill-mask")
    if task != "fill-mask":
        raise ConfigError(
            f"{transformer}: transformer_task {task!r}; SpladePooling pools a fill-mask "
            "transformer's logits"
        )
    pooling_file = folder / str(modules[1].get("path") or "") / "config.json"
    pooling = _read_json(pooling_file) if pooling_file.is_file() else {}
    if not isinstance(pooling, dict):
        raise ConfigError(f"{pooling_file} must hold a JSON object")
    strategy = str(pooling.get("pooling_strategy", "max"))
    activation = str(pooling.get("activation_function", "relu"))
    if strategy not in _STRATEGIES or activation not in _ACTIVATIONS:
        raise ConfigError(
            f"{pooling_file}: pooling_strategy {strategy!r} and activation_function "
            f"{activation!r}; SpladePooling takes {' or '.join(_STRATEGIES)} and "
            f"{' or '.join(_ACTIVATIONS)}"
        )
    return Splade(folder=folder, transformer=transformer, strategy=strategy, activation=activation)


class SpladeHead(VectorHead):
    """A sparse embedder's head: texts in, one weight per vocabulary term out.

    The folder's text pipeline tokenizes (window, prompts, lower-casing); the runner's
    step pools on the device, so a row arrives finished.
    """

    kind = SPARSE

    def finish(
        self, raw: npt.NDArray[np.float32], features: Mapping[str, Any]
    ) -> npt.NDArray[np.float32]:
        """The rows as the runner's step pooled them."""
        return raw

    def check(self, half: bool) -> Check:
        """No weight moved by more than a tolerance (a looser one at 16 bits)."""
        return logits_within(0.02 if half else 1e-4)


def splade_step(strategy: str, activation: str) -> Any:
    """The runner's step: the masked-LM logits pooled as ``SpladePooling`` pools them."""

    def step(model: Any, inputs: dict[str, Any]) -> Any:
        logits = model(**inputs).logits
        mask = inputs["attention_mask"].unsqueeze(-1).to(logits.dtype)
        weights = (logits * mask).relu_().log1p_()
        if activation == "log1p_relu":
            weights = weights.log1p_()
        return weights.amax(dim=1) if strategy == "max" else weights.sum(dim=1)

    return step


def on_torch(path: str | Path, runtime: Runtime | None = None) -> EngineModel:
    """The sparse embedder saved in the folder ``path``, on torch.

    Args:
        path: a SparseEncoder folder, or a bare ``...ForMaskedLM`` folder (served with
            ``--pooling splade``).
        runtime: device, precision and threads (backend ``torch`` or ``auto``).

    Raises:
        ConfigError: an exported backend (no gate judges sparse rows on one yet), a
            folder that is not a SPLADE model, a device that is not here or a precision
            the machine cannot compute in.
        ImportError: the ``embeddings`` extra is missing.
    """
    runtime = runtime or Runtime(backend="torch")
    if runtime.backend not in ("torch", "auto"):
        raise ConfigError(
            f"backend {runtime.backend}: a sparse embedder is served on torch only (no "
            "quality gate judges an exported engine's sparse vectors yet); use --backend "
            "torch or auto"
        )
    splade = read_splade(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from transformers import AutoModelForMaskedLM
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    device, dtype = place_torch(runtime)
    tokenizer, lower = transformer_tokenizer(splade.transformer)
    model = AutoModelForMaskedLM.from_pretrained(str(splade.transformer), local_files_only=True)
    model.eval()
    model.to(device)
    if dtype in ("float16", "bfloat16"):
        model = model.to(getattr(torch, dtype))
    vocabulary = int(model.get_output_embeddings().weight.shape[0])
    pipeline = TextPipeline(
        folder=splade.folder,
        layout="modules.json" if (splade.folder / "modules.json").is_file() else "save_pretrained",
        tokenizer=tokenizer,
        window=int(tokenizer.model_max_length),
        lower_case=lower,
        pooling_modes=(f"splade_{splade.strategy}",),
        include_prompt=True,
        steps=(),
        dimension=vocabulary,
        prompts=folder_prompts(splade.folder),
    )
    runner = TorchRunner(
        model,
        splade_step(splade.strategy, splade.activation),
        autocast=dtype.removesuffix("-mixed") if "mixed" in dtype else None,
    )
    return EngineModel(runner, SpladeHead(pipeline))


def _st_config(transformer: Path) -> dict[str, Any]:
    file = transformer / "sentence_bert_config.json"
    data = _read_json(file) if file.is_file() else {}
    return data if isinstance(data, dict) else {}


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file} is not readable JSON: {exc}") from exc
