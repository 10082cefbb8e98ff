"""Inputs longer than the model's window: cut (the default), or split into windows and pooled.

A model reads at most its window of tokens (``LoadedModel.max_input_tokens``); by default
a longer input is truncated to it, as every server does
(:mod:`~batchserve.server.protocols.window`). A request to an embedding route may ask
instead that such an input be split (``"long_inputs": {"split": true, "overlap": N}``):

* the input is tokenized (without special tokens; its prompt apart) and cut on token
  boundaries, preferring the start of a word, into windows of at most the window's
  tokens less the model's special tokens and the prompt's; consecutive windows share
  ``overlap`` tokens (a little more where a window's start moves back to its word's);
* each window is a text of its own (the input's characters from its first token to its
  last, the prompt prepended again), so the engine gives it the model's special tokens
  as it gives any text, and the batcher runs it as an ordinary item under the request's
  deadline: a request's items are its windows, and admission, the queue bound and the
  counts (``usage``, ``X-Compute-Tokens``) see windows;
* the windows' vectors are pooled into the input's by a mean weighted by each window's
  tokens in its pass (what vLLM's chunked processing does across chunks, whatever the
  model's own pooling), then scaled to unit length if the model's vectors are.

An input within the window is one item, as without the field. Splitting tokenizes the
request's texts on the event loop, before it is queued (as ``truncate: false`` does), on the
model's spare tokenizer (:mod:`batchserve.models.spare_tokenizer`), so the engine's passes
never wait for it.

``--max-input-chars`` is a limit on what a request may carry; with truncation on (no
``truncate: false``, no split) a longer text is cut to it rather than refused
(:func:`cut_over_chars`): the model would cut it anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from batchserve.models.kinds import PromptedText, prompt_of
from batchserve.server.statuses import ApiError

if TYPE_CHECKING:
    from batchserve.models.loader import LoadedModel
    from batchserve.server.registry import ServedModel
    from batchserve.server.settings import RequestLimits

__all__ = [
    "LongInputs",
    "Windows",
    "check_queue",
    "cut_over_chars",
    "long_inputs",
    "split_windows",
]

#: How many times a split is redone with a smaller budget when a window, tokenized again as
#: a text of its own, takes more tokens than it did inside the whole input.
_RETRIES = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class LongInputs:
    """What a request asks of its inputs over the window.

    Attributes:
        split: split them into windows and pool the windows' vectors (else: truncate).
        overlap: the tokens consecutive windows share.
    """

    split: bool = False
    overlap: int = 0


def long_inputs(value: dict[str, Any] | None) -> LongInputs | None:
    """The request's ``long_inputs`` as read by its body's rule; None: absent or no split."""
    if not value or not value.get("split"):
        return None
    return LongInputs(split=True, overlap=int(value.get("overlap") or 0))


@dataclass(frozen=True, slots=True, kw_only=True)
class Windows:
    """A request's inputs as the items that run, and how to pool them back.

    Attributes:
        items: what the batcher runs: each input within the window, the windows of the others.
        spans: each input's items, ``(start, stop)`` into ``items``, in input order.
        split: how many inputs were split.
    """

    items: list[Any]
    spans: tuple[tuple[int, int], ...]
    split: int

    def pool(
        self, outputs: Sequence[Any], counts: Sequence[int] | None, *, normalize: bool
    ) -> list[npt.NDArray[np.float32]]:
        """One vector per input from the items' ``outputs``.

        A split input's vector is its windows' mean weighted by ``counts`` (each window's
        tokens in its pass; None: equal weights), scaled to unit length when ``normalize``.
        """
        out: list[npt.NDArray[np.float32]] = []
        for start, stop in self.spans:
            if stop - start == 1:
                out.append(np.asarray(outputs[start], dtype=np.float32))
                continue
            rows = np.asarray(outputs[start:stop], dtype=np.float64)
            weights = (
                np.asarray(counts[start:stop], dtype=np.float64)
                if counts is not None
                else np.ones(stop - start)
            )
            vector = weights @ rows / weights.sum()
            if normalize:
                norm = float(np.linalg.norm(vector))
                if norm > 0:
                    vector = vector / norm
            out.append(vector.astype(np.float32))
        return out


def check_queue(model: ServedModel, items: int, field: str = "input") -> None:
    """Refuse a request of more items (windows) than ``model``'s queue holds.

    Raises:
        ApiError: ``too_large`` (413): it could never be admitted whole.
    """
    queue = model.config.queue_size
    if items > queue:
        raise ApiError(
            "too_large",
            f"the request's inputs split into {items} windows and model {model.name!r} queues "
            f"at most {queue} (--queue-size): it could never be admitted whole",
            param=field,
        )


def cut_over_chars(texts: Any, limits: RequestLimits) -> Any:
    """``texts`` with each string over ``--max-input-chars`` cut to it.

    ``texts`` is a string or a list, as the body holds it; anything else is returned as it
    is (the field's rule names it), and so are texts within the limit (the same object).
    """
    most = limits.max_input_chars
    if isinstance(texts, str):
        return texts[:most] if len(texts) > most else texts
    if isinstance(texts, list):
        for t in texts:  # a loop, not any(): no generator on every request
            if isinstance(t, str) and len(t) > most:
                return [u[:most] if isinstance(u, str) and len(u) > most else u for u in texts]
    return texts


def split_windows(
    loaded: LoadedModel, texts: Sequence[Any], overlap: int, field: str = "long_inputs"
) -> Windows | None:
    """``texts`` (their prompts prepended) with each one over the window split (see the module).

    Args:
        loaded: the model.
        texts: the inputs as they would run.
        overlap: the tokens consecutive windows share.
        field: the request's field that asked, as an error names it.

    Returns:
        The windows; None when no input is over the window, or the model cannot tell
        (nothing to split: the request runs as it is).

    Raises:
        ApiError: ``invalid`` (422) when ``overlap`` leaves a window no room to advance.
    """
    window = loaded.max_input_tokens
    untruncated = loaded.untruncated_tokens
    spare = loaded.spare_tokenizer
    if window is None or untruncated is None or spare is None or not texts:
        return None
    lengths = untruncated(texts)
    if all(n <= window for n in lengths):
        return None
    items: list[Any] = []
    spans: list[tuple[int, int]] = []
    split = 0
    with spare.held() as tokenizer:
        specials = len(tokenizer("")["input_ids"])
        for text, n in zip(texts, lengths, strict=True):
            start = len(items)
            if n <= window:
                items.append(text)
            else:
                items.extend(_split(tokenizer, text, window, specials, overlap, untruncated, field))
                split += 1
            spans.append((start, len(items)))
    return Windows(items=items, spans=tuple(spans), split=split)


def _split(
    tokenizer: Any,
    text: str,
    window: int,
    specials: int,
    overlap: int,
    untruncated: Any,
    field: str,
) -> list[str]:
    prompt = prompt_of(text)
    raw = text.text if isinstance(text, PromptedText) else text
    prompt_tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else 0
    budget = window - specials - prompt_tokens
    if overlap >= budget:
        raise ApiError(
            "invalid",
            f"{field}.overlap must be less than the tokens one window holds for this model "
            f"({budget}: its window of {window} less {specials} special and {prompt_tokens} "
            f"prompt tokens), got {overlap}",
            param=f"{field}.overlap",
        )
    enc = tokenizer(raw, add_special_tokens=False, return_offsets_mapping=True, truncation=False)
    offsets: list[tuple[int, int]] = enc["offset_mapping"]
    words: list[int | None] = enc.word_ids()
    for _ in range(_RETRIES):
        pieces = [raw[offsets[a][0] : offsets[b - 1][1]] for a, b in _cuts(words, budget, overlap)]
        windows = [PromptedText(prompt, p) if prompt else p for p in pieces]
        over = max(untruncated(windows)) - window
        if over <= 0:
            return windows
        budget = max(overlap + 1, budget - over)  # a window took more tokens on its own
    return windows  # still over by a token or two: the window cuts it, as truncation would


def _cuts(words: list[int | None], budget: int, overlap: int) -> list[tuple[int, int]]:
    # Token ranges [a, b) of at most ``budget`` tokens, each starting ``budget - overlap``
    # tokens after the last (about), both ends moved back to a word's start where the word
    # allows it, and always forward.
    n = len(words)
    out: list[tuple[int, int]] = []
    a = 0
    while True:
        b = min(a + budget, n)
        if b < n:
            b = _word_start(words, b, a + 1)
        out.append((a, b))
        if b >= n:
            return out
        nxt = _word_start(words, b - overlap, a + 1) if overlap else b
        a = max(nxt, a + 1)


def _word_start(words: list[int | None], i: int, least: int) -> int:
    # The nearest token at or before ``i`` (not before ``least``) that starts a word; ``i``
    # itself when the word runs back past ``least`` (a word longer than a window).
    j = i
    while j > least and words[j] is not None and words[j] == words[j - 1]:
        j -= 1
    if words[j] is None or words[j] != words[j - 1]:
        return j
    return i
