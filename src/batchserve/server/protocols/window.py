"""A model's window as every route tells it: what is refused, what was cut, what was counted.

A model cuts each input at its window (``LoadedModel.max_input_tokens``: 512 tokens for
MiniLM). The routes say so the same way, whatever their protocol:

* a route with a ``truncate`` flag (TEI's ``/embed``, ``/similarity``, ``/rerank``,
  ``/predict``, ``POST /``) refuses an input over the window when the flag is false, as
  TEI does: 413, naming the input and its token count (:func:`refuse_over_window`; the one
  case where a request is tokenized on the event loop, before it is queued);
* every answer that holds a cut input says how many in the ``X-Truncated-Inputs`` header
  (over gRPC, the trailing metadata of the same name) (:func:`truncated`);
* token counts (OpenAI's and Infinity's ``usage``, TEI's ``X-Compute-Tokens``) are the
  tokens each input took in its pass: after the cut, prompt included.

Telling a cut input from one that fills the window exactly needs its length before the
cut: the model's ``untruncated_tokens`` is asked only for inputs whose count reached the
window (the counts themselves come from the pass, remembered by the engine), so an answer
with no long input costs no second tokenization. A model that cannot count
(``count_tokens`` or ``untruncated_tokens`` None) refuses nothing and reports no cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchserve.models.loader import LoadedModel
from batchserve.server.statuses import ApiError

__all__ = ["TRUNCATED_HEADER", "refuse_over_window", "token_counts", "truncated", "truncated_head"]

#: The response header saying how many inputs were truncated to the model's window.
TRUNCATED_HEADER = "X-Truncated-Inputs"


def refuse_over_window(
    loaded: LoadedModel, items: Sequence[Any], field: str = "input", *, splits: bool = False
) -> None:
    """Refuse a request one of whose ``items`` is over the model's window.

    Args:
        loaded: the model.
        items: what would run (a prompt already prepended).
        field: the request's field that holds the inputs, as the error names it.
        splits: the route can split inputs into windows (``long_inputs``): the error says so.

    Raises:
        ApiError: ``too_large`` (413) naming the first such input and its token count.
    """
    window = loaded.max_input_tokens
    untruncated = loaded.untruncated_tokens
    if window is None or untruncated is None:
        return
    for i, n in enumerate(untruncated(items)):
        if n > window:
            raise ApiError(
                "too_large",
                f"input {i} is {n} tokens, over the model's window of {window}; "
                "send truncate=true (the default) to truncate it"
                + (', or long_inputs: {"split": true} to embed it in windows' if splits else ""),
                param=f"{field}[{i}]",
            )


def token_counts(loaded: LoadedModel, items: Sequence[Any]) -> list[int] | None:
    """The tokens each item took in its pass (after the cut), or None: the model counts none."""
    count = loaded.count_tokens
    return count(items) if count is not None else None


def truncated(loaded: LoadedModel, items: Sequence[Any], counts: Sequence[int] | None) -> int:
    """How many of ``items`` the window cut, from their pass ``counts`` (see the module)."""
    window = loaded.max_input_tokens
    untruncated = loaded.untruncated_tokens
    if window is None or untruncated is None or counts is None:
        return 0
    full = [items[i] for i, n in enumerate(counts) if n >= window]
    if not full:
        return 0
    return sum(1 for n in untruncated(full) if n > window)


def truncated_head(loaded: LoadedModel, items: Sequence[Any]) -> bytes:
    """The ``X-Truncated-Inputs`` header line for ``items``; empty when none was cut."""
    cut = truncated(loaded, items, token_counts(loaded, items))
    return b"x-truncated-inputs: %d\r\n" % cut if cut else b""
