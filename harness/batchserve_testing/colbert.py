"""ColBERT folders as PyLate 1.6 saves them, and PyLate's own model loaded on one.

:func:`write_folder` turns a transformer folder (``save_pretrained``'s model and
tokenizer) into what ``pylate.models.ColBERT(transformer, embedding_size=D).save(folder)``
writes under sentence-transformers 5.3 (the version PyLate 1.6 pins): the ``[Q] ``/``[D] ``
markers added to the tokenizer (and the embeddings resized), ``1_Dense``
(``pylate.models.Dense.Dense``, no bias, random weights), ``modules.json`` and
``config_sentence_transformers.json`` (``model_type: ColBERT``, the markers,
``query_length``, ``document_length``, ``do_query_expansion``,
``attend_to_expansion_tokens``, ``skiplist_words``). It is written here rather than by
PyLate because PyLate 1.6's own loading and saving reach into sentence-transformers 5's
private loaders (``_load_sbert_model``, ``_model_config``), which version 6 no longer calls.

:func:`reference` is PyLate's own ``ColBERT`` built on such a folder's modules (the
transformer and PyLate's ``Dense.load``) with the folder's settings, as PyLate's loader
sets them: its ``encode``, tokenizing, query expansion and skiplist are PyLate's. One
piece is sentence-transformers 5.3's rather than 6's: the transformer's ``tokenize``
(texts stripped, truncated to ``max_seq_length``, padded as asked). PyLate pads a query
with ``padding="max_length"`` to ``query_length`` (its query expansion); version 6 routes
``tokenize`` to ``preprocess``, which drops that argument, so under 6 a query would be
padded only to its batch's longest and its vectors would depend on the batch.
"""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path
from typing import Any

__all__ = ["SETTINGS", "reference", "write_folder"]

#: PyLate's settings written into a folder (small lengths, so that tests cut texts).
SETTINGS: dict[str, Any] = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 12,
    "document_length": 40,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": False,
    "skiplist_words": list(string.punctuation),
}


def write_folder(
    transformer: Path, folder: Path, *, dimension: int, seed: int = 7, **settings: Any
) -> Path:
    """``transformer``'s model and tokenizer as a ColBERT folder at ``folder``.

    Args:
        transformer: a folder ``save_pretrained`` wrote (model and tokenizer).
        folder: where the ColBERT folder goes (replaced).
        dimension: the projection's output (a token vector's length).
        seed: the projection's random weights' seed.
        settings: override :data:`SETTINGS`.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoTokenizer

    shutil.rmtree(folder, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(str(transformer))
    model = AutoModel.from_pretrained(str(transformer)).eval()
    tokenizer.add_tokens(["[Q] ", "[D] "])
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    hidden = int(model.config.hidden_size)
    torch.manual_seed(seed)
    dense = folder / "1_Dense"
    dense.mkdir()
    weight = torch.randn(dimension, hidden) * (1.0 / hidden**0.5)
    save_file({"linear.weight": weight.contiguous()}, str(dense / "model.safetensors"))
    (dense / "config.json").write_text(
        json.dumps(
            {
                "in_features": hidden,
                "out_features": dimension,
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


def reference(folder: Path, device: str = "cpu") -> Any:
    """PyLate's ``ColBERT`` on ``folder``'s modules, with the folder's settings."""
    import warnings

    with warnings.catch_warnings():
        # PyLate 1.6 imports sentence-transformers 5's module paths, deprecated in 6.
        warnings.simplefilter("ignore")
        from pylate import models
        from sentence_transformers.models import Transformer

        if not hasattr(models.ColBERT, "_text_length"):
            # encode sorts texts by sentence-transformers 5's _text_length (gone in 6):
            # only the order texts are batched in, which no vector depends on.
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

        transformer.tokenize = tokenize
        config = json.loads((folder / "config_sentence_transformers.json").read_text())
        keys = (
            "query_prefix",
            "document_prefix",
            "query_length",
            "document_length",
            "do_query_expansion",
            "attend_to_expansion_tokens",
            "skiplist_words",
        )
        return models.ColBERT(
            modules=[transformer, models.Dense.load(str(folder / "1_Dense"))],
            device=device,
            **{k: config[k] for k in keys if k in config},
        )
