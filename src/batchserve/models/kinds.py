"""What a model does, named once: its kind, read from its folder, and the routes it answers.

A served model is one of four kinds:

* ``embedding``: a text in, a float vector out (a sentence-transformers folder, the built-in
  MiniLM, a synthetic model with a dimension);
* ``reranker``: a (query, passage) pair in, one relevance logit out: a sequence
  classification model with one label (what ``CrossEncoder.save`` or a
  ``...ForSequenceClassification.save_pretrained`` with ``num_labels=1`` writes);
* ``classifier``: a text (or a pair) in, one logit per label out: a sequence classification
  model with several labels, named by its ``id2label``;
* ``generic``: anything else (an imported batch function).

:func:`folder_kind` reads the kind from a folder's ``config.json`` alone (no weights are
loaded): an architecture whose name ends in ``ForSequenceClassification`` is a reranker or a
classifier by its number of labels; every other folder is an embedding model, as before.

:data:`ROUTES` names, per kind, the route a client should use: a route asked of the wrong
kind answers 400 with :func:`wrong_kind`'s message.

:func:`item_of` names what one of a kind's items is, the unit every count of items and
every rate of the operations views (``/status``, ``/metrics``, the dashboard, ``top``,
Triton's configuration and statistics) is in: a reranker's item is a ``pair`` (one query
and one passage: a request of one query and N passages is N items); an embedder's and a
classifier's a ``text``. A classifier may be sent a pair (TEI's ``/predict``): it is one
item like a text, one sequence through the model, and is counted as a ``text`` (the unit
names the kind's usual input; a pass may mix both).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

from batchserve.errors import ConfigError

__all__ = [
    "ITEMS",
    "KINDS",
    "ROUTES",
    "FolderKind",
    "Kind",
    "PromptedText",
    "Prompts",
    "apply_prompt",
    "folder_kind",
    "folder_prompts",
    "item_of",
    "prompt_of",
    "wrong_kind",
]

Kind: TypeAlias = Literal["embedding", "reranker", "classifier", "generic"]

#: Every kind, in the order the manual lists them.
KINDS: tuple[Kind, ...] = ("embedding", "reranker", "classifier", "generic")

#: The routes each kind answers, the first being the one a wrong-kind error points to.
ROUTES: dict[str, tuple[str, ...]] = {
    "embedding": ("POST /embed", "POST /v1/embeddings", "POST /similarity", "POST /embeddings"),
    "reranker": ("POST /rerank", "POST /v2/rerank", "POST /v1/rerank", "POST /predict"),
    "classifier": ("POST /predict", "POST /classify"),
    "generic": ("POST /v2/models/{name}/infer",),
}

#: What one item of each kind is (a kind not listed, ``generic``, has items of no known unit).
_ITEMS: dict[str, str] = {"embedding": "text", "reranker": "pair", "classifier": "text"}

#: Every unit :func:`item_of` names.
ITEMS: tuple[str, ...] = ("pair", "text")


def item_of(kind: str | None) -> str | None:
    """What one item of a model of ``kind`` is: ``pair``, ``text``, or None (see above).

    None for a ``generic`` model (its items are whatever its function takes) and for no
    kind (a model still loading).
    """
    return _ITEMS.get(kind) if kind is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class FolderKind:
    """What a model folder's ``config.json`` says it is.

    Attributes:
        kind: ``embedding``, ``reranker`` or ``classifier``.
        labels: the label of each logit, in order (``id2label``); empty for an embedder.
        architecture: the first architecture named, if any.
    """

    kind: Kind
    labels: tuple[str, ...] = ()
    architecture: str | None = None


def folder_kind(path: str | Path) -> FolderKind:
    """The kind of the model saved in ``path`` (see the module docstring).

    Raises:
        ConfigError: ``config.json`` is there but not a JSON object, or a sequence
            classification model's labels are malformed.
    """
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return FolderKind(kind="embedding")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config_file} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{config_file} must hold a JSON object")
    architectures = config.get("architectures") or []
    first = architectures[0] if architectures and isinstance(architectures[0], str) else None
    if not any(
        isinstance(a, str) and a.endswith("ForSequenceClassification") for a in architectures
    ):
        return FolderKind(kind="embedding", architecture=first)
    labels = _labels(config, config_file)
    kind: Kind = "reranker" if len(labels) == 1 else "classifier"
    return FolderKind(kind=kind, labels=labels, architecture=first)


def _labels(config: dict[str, object], where: Path) -> tuple[str, ...]:
    id2label = config.get("id2label")
    count = config.get("num_labels")
    if isinstance(id2label, dict) and id2label:
        try:
            by_id = {int(k): str(v) for k, v in id2label.items()}
        except ValueError:
            raise ConfigError(f"{where}: id2label keys must be integers, got {id2label}") from None
        if sorted(by_id) != list(range(len(by_id))):
            raise ConfigError(f"{where}: id2label must name labels 0..N-1, got {sorted(by_id)}")
        return tuple(by_id[i] for i in range(len(by_id)))
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        return tuple(f"LABEL_{i}" for i in range(count))
    return ("LABEL_0", "LABEL_1")  # transformers' default num_labels


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompts:
    """An embedding model's named prompts, as sentence-transformers saves them.

    Attributes:
        prompts: name -> the text prepended to an input (``{"query": "query: "}``).
        default: the prompt applied when a request names none (None: none).
    """

    prompts: dict[str, str]
    default: str | None = None


def folder_prompts(path: str | Path) -> Prompts:
    """The prompts of ``config_sentence_transformers.json`` in ``path`` (none if absent).

    Raises:
        ConfigError: the file names a default prompt it does not define.
    """
    config_file = Path(path) / "config_sentence_transformers.json"
    if not config_file.is_file():
        return Prompts(prompts={})
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config_file} is not readable JSON: {exc}") from exc
    raw = config.get("prompts") if isinstance(config, dict) else None
    prompts = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    default = config.get("default_prompt_name") if isinstance(config, dict) else None
    if default is not None and default not in prompts:
        raise ConfigError(
            f"{config_file}: default_prompt_name {default!r} is not one of its prompts "
            f"({', '.join(prompts) or 'none'})"
        )
    return Prompts(prompts=prompts, default=default)


class PromptedText(str):
    """A text with a prompt prepended: the joined string, which still knows its two parts.

    It is a ``str`` (the prompt, then the text), so everything that reads an embedder's
    items (token counts, estimates, the batcher) reads it as the text the model sees; an
    engine reads :attr:`prompt` to keep the prompt's tokens out of the pooling where the
    folder says so (``include_prompt: false``), as ``SentenceTransformer.encode(...,
    prompt_name=...)`` does.

    Attributes:
        prompt: the prompt (never empty: an empty prompt is no prompt).
        text: the text as the caller sent it.
    """

    prompt: str
    text: str

    def __new__(cls, prompt: str, text: str) -> PromptedText:
        """``prompt + text``, knowing both."""
        obj = super().__new__(cls, prompt + text)
        obj.prompt = prompt
        obj.text = text
        return obj

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]
        return self.prompt, self.text


def prompt_of(item: object) -> str | None:
    """The prompt ``item`` was given (a :class:`PromptedText`'s), else None."""
    return item.prompt if isinstance(item, PromptedText) else None


def apply_prompt(texts: list[str], prompts: Prompts | None, name: str | None) -> list[str]:
    """``texts`` with the prompt ``name`` (or the default, if None) prepended.

    Each prompted text is a :class:`PromptedText` (the joined string, knowing its prompt);
    an empty prompt (sentence-transformers saves ``"document": ""``) leaves the texts as
    they are, as ``encode`` does.

    Raises:
        KeyError: ``name`` is not a prompt of the model (the message names those it has).
    """
    if prompts is None:
        if name is not None:
            raise KeyError(f"prompt_name {name!r} is not known: this model defines no prompts")
        return texts
    name = name if name is not None else prompts.default
    if name is None:
        return texts
    prompt = prompts.prompts.get(name)
    if prompt is None:
        known = ", ".join(sorted(prompts.prompts)) or "none"
        raise KeyError(f"prompt_name {name!r} is not known: this model defines {known}")
    if not prompt:
        return texts
    return [PromptedText(prompt, t) for t in texts]


def wrong_kind(name: str, kind: str, route: str) -> str:
    """The message of a route asked of a model of the wrong kind, naming the right route."""
    use = ROUTES.get(kind, ROUTES["generic"])[0].replace("{name}", name)
    article = "an" if kind[0] in "aeiou" else "a"
    return f"model {name!r} is {article} {kind} model and does not answer {route}; use {use}"
