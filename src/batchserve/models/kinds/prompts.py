"""An embedder's named prompts: read from its folder, and prepended to its texts.

sentence-transformers saves a model's prompts (``{"query": "query: "}``) and its default in
``config_sentence_transformers.json``; ``SentenceTransformer.encode(..., prompt_name=...)``
prepends one to each text. Every route that embeds does the same here
(:func:`apply_prompt`), so one text gets one vector whichever route it came by.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from batchserve.errors import ConfigError

__all__ = ["PromptedText", "Prompts", "apply_prompt", "folder_prompts", "prompt_of"]


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


def apply_prompt(
    texts: list[str], prompts: Prompts | None, name: str | None, field: str = "prompt_name"
) -> list[str]:
    """``texts`` with the prompt ``name`` (or the default, if None) prepended.

    Each prompted text is a :class:`PromptedText` (the joined string, knowing its prompt);
    an empty prompt (sentence-transformers saves ``"document": ""``) leaves the texts as
    they are, as ``encode`` does.

    Args:
        texts: the inputs.
        prompts: the model's prompts (None: it defines none).
        name: the prompt a request names (None: the default, if the model has one).
        field: the request's field that named it, as an error names it.

    Raises:
        KeyError: ``name`` is not a prompt of the model (the message names ``field`` and
            the prompts it has).
    """
    if prompts is None:
        if name is not None:
            raise KeyError(f"{field} {name!r} is not known: this model defines no prompts")
        return texts
    name = name if name is not None else prompts.default
    if name is None:
        return texts
    prompt = prompts.prompts.get(name)
    if prompt is None:
        known = ", ".join(sorted(prompts.prompts)) or "none"
        raise KeyError(f"{field} {name!r} is not known: this model defines {known}")
    if not prompt:
        return texts
    return [PromptedText(prompt, t) for t in texts]
