"""LLM rerankers on torch: a causal LM asked yes or no, scored by its two answer logits.

A causal-LM folder that declares a yes/no template (:mod:`batchserve.models.kinds.llm_template`)
is a :data:`~batchserve.models.kinds.RERANKER` and runs as an
:class:`~batchserve.engines.model.EngineModel`: a :class:`TemplateHead` (an item is a
``(query, document)`` pair, written into the template and tokenized as the model card's
recipe does: the body cut on the right to the window less the prefix and suffix, then
``prefix + body + suffix`` as token ids, padded on the left) composed with a
:class:`~batchserve.engines.runners.TorchRunner` whose step runs the decoder alone, takes the
last position's hidden state (a real token: the padding is on the left) and multiplies it by
the two rows of the LM head for ``yes`` and ``no``, not the whole vocabulary at every
position. The row is the one logit ``yes - no`` (sentence-transformers' ``LogitScore``); the
reranker's sigmoid makes it ``P(yes) = softmax([no, yes])[yes]``, the card's score.

Positions are counted from each item's first real token (``position_ids`` from the attention
mask), so a pair scored among longer ones sees the positions it sees alone.

Torch only: no exported engine is gated for this kind yet, so ``auto`` serves torch and an
exported backend named on purpose is refused (:func:`refuse_exported`). Sub-passes are not
captured as CUDA graphs (a left-padded decoder, :func:`~batchserve.engines.runners.can_capture`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.cuda_graphs import Check, logits_within
from batchserve.engines.heads import item_key
from batchserve.engines.model import EngineModel
from batchserve.engines.runners import TorchRunner
from batchserve.engines.runtime import Runtime, place_torch
from batchserve.engines.sequence import EXTRA_HINT
from batchserve.errors import ConfigError
from batchserve.models.kinds import RERANKER, Kind
from batchserve.models.kinds.llm_template import RerankTemplate, read_template
from batchserve.models.token_counts import estimate_tokens

__all__ = ["LibraryHead", "TemplateHead", "on_torch", "refuse_exported"]


def refuse_exported(where: str | Path, backend: str) -> ConfigError:
    """The error for an exported ``backend`` asked of an LLM reranker."""
    return ConfigError(
        f"{where}: an LLM reranker (a causal LM with a yes/no template) runs on torch only; "
        f"no quality gate admits backend {backend} for it yet: serve it with backend=torch "
        "or auto"
    )


class TemplateHead:
    """An LLM reranker's head: pairs in, one logit (``yes - no``) per pair out.

    Args:
        tokenizer: the model's fast tokenizer.
        template: the folder's yes/no template.
        window: the window in tokens, prefix and suffix included.
    """

    kind: Kind = RERANKER
    labels: tuple[str, ...] = ("LABEL_0",)
    pooling = None
    normalized = None
    left_padded = True
    width = 1

    def __init__(self, tokenizer: Any, *, template: RerankTemplate, window: int) -> None:
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self.template = template
        self.prefix: list[int] = tokenizer.encode(template.prefix, add_special_tokens=False)
        self.suffix: list[int] = tokenizer.encode(template.suffix, add_special_tokens=False)
        self.window = window
        self._room = window - len(self.prefix) - len(self.suffix)
        if self._room < 1:
            raise ConfigError(
                f"max_length {window} leaves no room for a pair after the template's "
                f"{len(self.prefix)} prefix and {len(self.suffix)} suffix tokens"
            )
        pad = tokenizer.pad_token_id
        self._pad = int(pad if pad is not None else (tokenizer.eos_token_id or 0))

    @property
    def tokenizer(self) -> Any:
        """The model's fast tokenizer."""
        return self._tokenizer

    def groups(self, items: Sequence[Any]) -> list[list[int]]:
        """All the pairs in one group.

        Raises:
            TypeError: an item is not a pair of strings.
        """
        for i, item in enumerate(items):
            if not (
                isinstance(item, tuple)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], str)
            ):
                raise TypeError(
                    f"input {i} must be a (query, document) pair of strings: an LLM reranker "
                    f"scores pairs, got {type(item).__name__}"
                )
        return [list(range(len(items)))] if items else []

    def _bodies(self, items: Sequence[Any], *, cut: bool) -> list[list[int]]:
        texts = [self.template.format(q, d) for q, d in items]
        with self._lock:
            if cut:
                enc = self._tokenizer(texts, truncation=True, max_length=self._room)
            else:
                enc = self._tokenizer(texts)
        return [list(ids) for ids in enc["input_ids"]]

    def tokenize(self, items: Sequence[Any]) -> tuple[dict[str, Any], list[int]]:
        """The pairs written into the template, cut to the window, padded on the left."""
        rows = [self.prefix + body + self.suffix for body in self._bodies(items, cut=True)]
        counts = [len(r) for r in rows]
        width = max(counts)
        ids = np.full((len(rows), width), self._pad, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = row
            mask[i, width - len(row) :] = 1
        return {"input_ids": ids, "attention_mask": mask}, counts

    def finish(
        self, raw: npt.NDArray[np.float32], features: Mapping[str, Any]
    ) -> npt.NDArray[np.float32]:
        """The logit as the runner answers it (the protocol applies the sigmoid)."""
        return raw

    def count(self, items: Sequence[Any]) -> list[int]:
        """Tokens per pair as a pass sees them (the template's included, cut to the window)."""
        return [min(n, self.window) for n in self.untruncated(items)]

    def untruncated(self, items: Sequence[Any]) -> list[int]:
        """Tokens per pair before the body is cut (the template's included)."""
        if not items:
            return []
        extra = len(self.prefix) + len(self.suffix)
        return [len(body) + extra for body in self._bodies(items, cut=False)]

    def estimate(self, item: Any) -> int:
        """About how many tokens the pair takes in the template (its characters)."""
        n = estimate_tokens(item[0], 1 << 30) + estimate_tokens(item[1], 1 << 30)
        return min(n + len(self.prefix) + len(self.suffix) + 8, self.window)

    def key(self, item: Any) -> str:
        """The pair's two texts joined (:func:`~batchserve.engines.heads.item_key`)."""
        return item_key(item)

    def shaped(self, n: int, width: int) -> dict[str, Any]:
        """``n`` rows of exactly ``width`` tokens (the prefix repeated), all real."""
        row = (self.prefix * (width // max(1, len(self.prefix)) + 1))[:width]
        ids = np.tile(np.asarray(row, dtype=np.int64), (n, 1))
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    def check(self, half: bool) -> Check:
        """No logit moved by more than a tolerance (a looser one at 16 bits)."""
        return logits_within(0.02 if half else 1e-4)


def on_torch(path: str | Path, runtime: Runtime | None = None) -> EngineModel:
    """The LLM reranker saved in the folder ``path``, on torch.

    Raises:
        ConfigError: the folder declares no template (or a bad one), its yes or no is not
            one token of its vocabulary, or the runtime asks for an exported backend, a
            device that is not here or a precision the machine cannot compute in.
        ImportError: the ``embeddings`` extra is missing.
    """
    runtime = runtime or Runtime(backend="torch")
    if runtime.backend not in ("torch", "auto"):
        raise refuse_exported(path, runtime.backend)
    template = read_template(path)
    if template is None:
        return _on_library(path, runtime)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    device, dtype = place_torch(runtime)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    answers = [
        _token(tokenizer, template.yes, "yes", path),
        _token(tokenizer, template.no, "no", path),
    ]
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    model.eval()
    model.to(device)
    if dtype in ("float16", "bfloat16"):
        model = model.to(getattr(torch, dtype))
    positions = getattr(model.config, "max_position_embeddings", None)
    window = min(template.max_length, positions) if positions else template.max_length
    head = TemplateHead(tokenizer, template=template, window=window)
    runner = TorchRunner(
        model,
        _step(model, answers),
        autocast=dtype.removesuffix("-mixed") if "mixed" in dtype else None,
    )
    return EngineModel(runner, head)


class LibraryHead(TemplateHead):
    """A sentence-transformers ``CrossEncoder`` LLM reranker's head: its own ``preprocess``.

    The folder's ``Transformer`` module renders and tokenizes each pair as ``predict`` does
    (its chat template, its prompt, its window, padded on the left); the rows are what
    :class:`TemplateHead` makes of them.

    Args:
        encoder: the folder's ``CrossEncoder``.
        window: its window in tokens (``max_seq_length``).
    """

    def __init__(self, encoder: Any, *, window: int) -> None:
        self._tokenizer = encoder.tokenizer
        self._lock = threading.Lock()
        self._encoder = encoder
        self._prompt = encoder._resolve_prompt(None, None)
        self.window = window
        self.prefix = []
        self.suffix = []

    def tokenize(self, items: Sequence[Any]) -> tuple[dict[str, Any], list[int]]:
        """The pairs as ``CrossEncoder.predict`` preprocesses them (padded on the left)."""
        with self._lock:
            features = self._encoder.preprocess(list(items), prompt=self._prompt)
        out = {
            name: np.asarray(features[name].cpu().numpy(), dtype=np.int64)
            for name in ("input_ids", "attention_mask")
        }
        return out, [int(n) for n in out["attention_mask"].sum(axis=1)]

    def untruncated(self, items: Sequence[Any]) -> list[int]:
        """Tokens per pair as preprocessed (cut to the window: the library renders it)."""
        if not items:
            return []
        return self.tokenize(items)[1]

    def estimate(self, item: Any) -> int:
        """About how many tokens the pair takes (its characters and some for the prompt)."""
        n = estimate_tokens(item[0], 1 << 30) + estimate_tokens(item[1], 1 << 30)
        return min(n + 16, self.window)

    def shaped(self, n: int, width: int) -> dict[str, Any]:
        """``n`` rows of ``width`` tokens (a long pair's first ones), all real."""
        features, _ = self.tokenize([("shape " * width, "shape " * width)] * n)
        ids = np.ascontiguousarray(features["input_ids"][:, -width:])
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def _on_library(path: str | Path, runtime: Runtime) -> EngineModel:
    # A CrossEncoder saved with a causal LM and LogitScore: the library renders each pair,
    # the step is the same (its true and false tokens; sigmoid, its default activation).
    try:
        import torch
        from sentence_transformers import CrossEncoder
        from sentence_transformers.cross_encoder.modules import LogitScore
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    device, dtype = place_torch(runtime)
    encoder: Any = CrossEncoder(str(path), device=device, local_files_only=True)
    scores = [m for m in encoder if isinstance(m, LogitScore)]
    if not scores:
        raise ConfigError(
            f"{path} declares no reranking template (batchserve_reranker.json) and is no "
            "sentence-transformers CrossEncoder with a LogitScore module"
        )
    activation = type(encoder.activation_fn).__name__ if encoder.activation_fn else "None"
    if activation != "Sigmoid":
        raise ConfigError(
            f"{path}: its CrossEncoder's activation_fn is {activation}; batchserve serves an "
            "LLM reranker's score through a sigmoid (sentence-transformers' default)"
        )
    score = scores[0]
    answers = [int(score.true_token_id)]
    if score.false_token_id is not None:
        answers.append(int(score.false_token_id))
    model: Any = encoder.model
    model.eval()
    if dtype in ("float16", "bfloat16"):
        model = model.to(getattr(torch, dtype))
    head = LibraryHead(encoder, window=int(encoder.max_seq_length or 512))
    runner = TorchRunner(
        model,
        _step(model, answers),
        autocast=dtype.removesuffix("-mixed") if "mixed" in dtype else None,
    )
    return EngineModel(runner, head)


def _token(tokenizer: Any, text: str, field: str, path: str | Path) -> int:
    # The answer must be one token, or its logit is not the answer's probability.
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ConfigError(
            f"{path}: batchserve_reranker.json's {field} ({text!r}) must be one token of the "
            f"model's vocabulary; the tokenizer makes it {len(ids)} tokens"
        )
    return int(ids[0])


def _step(model: Any, answers: list[int]) -> Any:
    # The decoder alone, then the last position's hidden state times the LM head's rows
    # for yes and no: [N, 1] = yes - no.
    import torch

    lm_head = model.get_output_embeddings()
    rows = lm_head.weight[answers].detach()
    bias = getattr(lm_head, "bias", None)
    bias = bias[answers].detach() if bias is not None else None
    cap = getattr(model.config, "final_logit_softcapping", None)

    def step(m: Any, inputs: dict[str, Any]) -> Any:
        mask = inputs["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = m.base_model(
            input_ids=inputs["input_ids"], attention_mask=mask, position_ids=positions
        )
        logits = out.last_hidden_state[:, -1] @ rows.to(out.last_hidden_state.dtype).T
        if bias is not None:
            logits = logits + bias
        if cap:
            logits = torch.tanh(logits / cap) * cap
        if logits.shape[1] == 1:  # LogitScore with no false token: the true logit alone
            return logits
        return logits[:, :1] - logits[:, 1:]

    return step
