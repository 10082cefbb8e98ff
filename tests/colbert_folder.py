"""A tiny random-weight ColBERT folder as PyLate 1.6 saves it, and PyLate loaded on it.

The folder is what ``pylate.models.ColBERT(bert, embedding_size=16).save(folder)`` writes
under sentence-transformers 5.3 (the version PyLate 1.6 pins): the zoo's two-layer 32-wide
BERT with the ``[Q] ``/``[D] `` markers added to its tokenizer (and its embeddings
resized), ``1_Dense`` (``pylate.models.Dense.Dense``, 32 -> 16, no bias),
``modules.json`` and ``config_sentence_transformers.json`` (``model_type: ColBERT``, the
markers, ``query_length``, ``document_length``, ``do_query_expansion``,
``attend_to_expansion_tokens``, ``skiplist_words``). It is written by hand because
PyLate 1.6's own loading and saving reach into sentence-transformers 5's private loaders
(``_load_sbert_model``, ``_model_config``), which version 6 (this venv's) no longer calls.

:func:`reference` is PyLate's own ``ColBERT`` built on that folder's modules (the
transformer and PyLate's ``Dense.load``) with the folder's settings, the way PyLate's
loader would set them: its ``encode``, tokenizing, query expansion and skiplist are
PyLate's.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

#: PyLate's settings written into the folder (small lengths, so that tests cut texts).
SETTINGS: dict[str, Any] = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 12,
    "document_length": 40,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": False,
    "skiplist_words": list(string.punctuation),
}


def build(root: Path, name: str = "colbert", **settings: Any) -> Path:
    """Write the folder under ``root``; ``settings`` override :data:`SETTINGS`."""
    import torch
    from safetensors.torch import save_file

    import zoo

    spec = zoo.Spec(name=name, family="bert", layout="bare", window=512)
    tokenizer = zoo.tokenizer_of(spec)
    tokenizer.add_tokens(["[Q] ", "[D] "])
    model = zoo.model_of(spec, tokenizer).eval()
    folder = root / name
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    torch.manual_seed(7)
    dense = folder / "1_Dense"
    dense.mkdir()
    weight = torch.randn(16, 32) * 0.3
    save_file({"linear.weight": weight.contiguous()}, str(dense / "model.safetensors"))
    (dense / "config.json").write_text(
        json.dumps(
            {
                "in_features": 32,
                "out_features": 16,
                "bias": False,
                "activation_function": "torch.nn.modules.linear.Identity",
                "use_residual": False,
            }
        )
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 511, "do_lower_case": False})
    )
    config = {
        "__version__": {"sentence_transformers": "5.3.0", "pylate": "1.6.0"},
        "model_type": "ColBERT",
        "prompts": {"query": "", "document": ""},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        **SETTINGS,
        **settings,
    }
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config, indent=2))
    return folder


def reference(folder: Path) -> Any:
    """PyLate's ``ColBERT`` on ``folder``'s modules, with the folder's settings."""
    from pylate import models
    from sentence_transformers.models import Transformer

    if not hasattr(models.ColBERT, "_text_length"):
        # encode sorts texts by sentence-transformers 5's _text_length (gone in 6): only
        # the order texts are batched in, which no vector depends on.
        models.ColBERT._text_length = lambda self, text: len(text)  # type: ignore[attr-defined]
    transformer = Transformer(str(folder))
    tokenizer = transformer.tokenizer

    def tokenize(texts: list[str], padding: str | bool = True, **_: Any) -> Any:
        # sentence-transformers 5.3's Transformer.tokenize for a list of texts.
        return tokenizer(
            [str(t).strip() for t in texts],
            padding=padding,
            truncation="longest_first",
            return_tensors="pt",
            max_length=transformer.max_seq_length,
        )

    transformer.tokenize = tokenize  # type: ignore[method-assign]
    config = json.loads((folder / "config_sentence_transformers.json").read_text())
    keys = ("query_prefix", "document_prefix", "query_length", "document_length",
            "do_query_expansion", "attend_to_expansion_tokens", "skiplist_words")  # fmt: skip
    return models.ColBERT(
        modules=[transformer, models.Dense.load(str(folder / "1_Dense"))],
        device="cpu",
        **{k: config[k] for k in keys if k in config},
    )
