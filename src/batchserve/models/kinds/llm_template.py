"""An LLM reranker's yes/no template, as its folder declares it (``batchserve_reranker.json``).

An LLM reranker (Qwen3-Reranker, mxbai-rerank-v2, bge-reranker-v2-gemma) is a causal
language model asked whether a document answers a query: each pair is written into the
model card's prompt (a prefix, the instruction, query and document in the body's format, a
suffix), and its score is the probability of the ``yes`` token against the ``no`` token at
the last position: ``softmax([no, yes])[yes]``, which is ``sigmoid(yes - no)``. So it is a
:data:`~batchserve.models.kinds.RERANKER`: the engine answers the one logit ``yes - no``
(sentence-transformers' ``LogitScore``), and the reranker's sigmoid makes it ``P(yes)``;
``raw_scores`` is the log-odds.

Nothing in a causal LM's own files says it is a reranker, nor which template it was trained
with, so the folder says so in a small JSON file (:data:`TEMPLATE_FILE`)::

    {"template": "qwen3"}

takes Qwen3-Reranker's card as it is (:data:`PRESETS`); any field below may be given on its
own or override a preset's:

* ``prefix``, ``suffix``: the text before and after each pair's body (tokenized apart, never
  truncated);
* ``body``: the pair's text, with ``{instruction}``, ``{query}`` and ``{document}``;
* ``instruction``: what ``{instruction}`` is;
* ``yes``, ``no``: the answer tokens (each one token of the vocabulary);
* ``max_length``: the window in tokens, prefix and suffix included (the body is cut on the
  right to fit, as the card's recipe cuts it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchserve.errors import ConfigError

__all__ = ["PRESETS", "TEMPLATE_FILE", "RerankTemplate", "read_template"]

#: The file a causal-LM folder declares its reranking template in.
TEMPLATE_FILE = "batchserve_reranker.json"

#: The model cards' templates, by name.
PRESETS: dict[str, dict[str, Any]] = {
    "qwen3": {
        "prefix": "<|im_start|>system\nJudge whether the Document meets the requirements based "
        'on the Query and the Instruct provided. Note that the answer can only be "yes" or '
        '"no".<|im_end|>\n<|im_start|>user\n',
        "suffix": "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "body": "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
        "instruction": "Given a web search query, retrieve relevant passages that answer the query",
        "yes": "yes",
        "no": "no",
        "max_length": 8192,
    },
}

_FIELDS = ("prefix", "suffix", "body", "instruction", "yes", "no", "max_length")


@dataclass(frozen=True, slots=True, kw_only=True)
class RerankTemplate:
    """How each (query, document) pair is asked of the model, and what answers it.

    Attributes:
        prefix: the text before the body.
        suffix: the text after the body (the last position is its last token).
        body: the pair's text, with ``{instruction}``, ``{query}`` and ``{document}``.
        instruction: the instruction written into the body.
        yes: the token whose probability is the score.
        no: the token it is weighed against.
        max_length: the window in tokens, prefix and suffix included.
    """

    prefix: str
    suffix: str
    body: str
    instruction: str
    yes: str
    no: str
    max_length: int

    def format(self, query: str, document: str) -> str:
        """The body of one pair (without prefix and suffix)."""
        return self.body.format(instruction=self.instruction, query=query, document=document)


def read_template(folder: str | Path) -> RerankTemplate | None:
    """The template ``folder`` declares in :data:`TEMPLATE_FILE`; None when it has none.

    Raises:
        ConfigError: the file is not a JSON object, names an unknown preset or field, or a
            field is missing or malformed (the message names the file and the field).
    """
    file = Path(folder) / TEMPLATE_FILE
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{file} must hold a JSON object, got {type(data).__name__}")
    fields: dict[str, Any] = {}
    preset = data.get("template")
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(
                f"{file}: template must be one of {', '.join(PRESETS)}, got {preset!r}"
            )
        fields.update(PRESETS[preset])
    unknown = sorted(set(data) - {"template", *_FIELDS})
    if unknown:
        raise ConfigError(
            f"{file}: unknown field {unknown[0]!r}; the fields are template, {', '.join(_FIELDS)}"
        )
    fields.update({k: v for k, v in data.items() if k != "template"})
    for name in _FIELDS:
        if name not in fields:
            raise ConfigError(f"{file}: {name} is missing (or name a template: qwen3)")
    for name in ("prefix", "suffix", "body", "instruction"):
        if not isinstance(fields[name], str):
            raise ConfigError(f"{file}: {name} must be a string, got {fields[name]!r}")
    for name in ("yes", "no"):
        if not isinstance(fields[name], str) or not fields[name]:
            raise ConfigError(f"{file}: {name} must be a non-empty string, got {fields[name]!r}")
    if fields["yes"] == fields["no"]:
        raise ConfigError(f"{file}: yes and no must be different tokens, both {fields['yes']!r}")
    length = fields["max_length"]
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ConfigError(f"{file}: max_length must be an integer >= 1, got {length!r}")
    try:
        fields["body"].format(instruction="", query="", document="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"{file}: body may name only {{instruction}}, {{query}} and {{document}}: {exc!r}"
        ) from None
    if "{query}" not in fields["body"] or "{document}" not in fields["body"]:
        raise ConfigError(f"{file}: body must contain {{query}} and {{document}}")
    return RerankTemplate(**{name: fields[name] for name in _FIELDS})
