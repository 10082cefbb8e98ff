"""Tiny random-weight SPLADE folders: what a user brings as a sparse embedder.

A ``BertForMaskedLM`` of two 32-wide layers (seeded) with MiniLM's tokenizer, its output
bias pushed below zero so that, as in a trained SPLADE model, most terms of a text weigh
nothing (a few hundred of 30,522 are kept). Saved four ways: as sentence-transformers 6
saves ``SparseEncoder(folder)`` (``Transformer`` of task ``fill-mask``, ``SpladePooling``),
as version 5 saved it (``MLMTransformer``), with ``sum`` pooling and the ``log1p_relu``
activation, and bare (``save_pretrained``: served with ``--pooling splade``).
"""

from __future__ import annotations

import json
from pathlib import Path

#: The layouts :func:`build_sparse_folder` makes.
LAYOUTS = ("st6", "st5", "sum", "bare")


def build_sparse_folder(path: Path, *, layout: str = "st6", seed: int = 0) -> Path:
    """A tiny SPLADE folder in ``path`` (see the module docstring for ``layout``)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from batchserve.engines.embeddings import builtin_path

    tokenizer = AutoTokenizer.from_pretrained(str(builtin_path()), local_files_only=True)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    model = BertForMaskedLM(config)
    with torch.no_grad():
        bias = model.cls.predictions.bias
        bias.copy_(torch.randn(bias.shape) * 0.05 - 0.4)
    bare = path / "bare" if layout != "bare" else path
    model.save_pretrained(str(bare))
    tokenizer.save_pretrained(str(bare))
    if layout == "bare":
        return path
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    folder = path / layout
    if layout == "st6":
        SparseEncoder(str(bare), device="cpu").save(str(folder))
    else:
        pooling = (
            SpladePooling("sum", activation_function="log1p_relu")
            if layout == "sum"
            else SpladePooling("max")
        )
        SparseEncoder(modules=[MLMTransformer(str(bare)), pooling], device="cpu").save(str(folder))
    if layout == "st6":  # a query prompt, as SPLADE v3's folders name theirs
        file = folder / "config_sentence_transformers.json"
        data = json.loads(file.read_text(encoding="utf-8"))
        data["prompts"] = {"query": "query: ", "document": ""}
        file.write_text(json.dumps(data), encoding="utf-8")
    if layout == "st5":  # version 5 stated the window in sentence_bert_config.json
        file = folder / "sentence_bert_config.json"
        data = json.loads(file.read_text(encoding="utf-8"))
        data["max_seq_length"] = 64
        file.write_text(json.dumps(data), encoding="utf-8")
    return folder
