"""Token counts: a cheap estimate before a pass, and a memory of the real counts after it.

:func:`estimate_tokens` sizes a text for batches formed by tokens on the event loop, where a
real tokenization (tens of microseconds) would cost more than the request's own path: about
4.5 characters per WordPiece token of English, measured on the quality set (the real count
over the estimate: mean 1.01, 90% of texts within 0.83-1.33).

:class:`TokenCounts` is a small bounded memory, so OpenAI's ``usage`` costs no second
tokenization.

Theory of operation: an embedder records the tokens of each text it just ran (from the
attention mask of the pass), keyed by the text's hash and length; :meth:`TokenCounts.get`
answers from that memory and calls the given tokenizer for the texts it does not hold.
The table is an LRU of :data:`CAPACITY` entries guarded by a lock (several workers may
record at once).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

__all__ = ["CAPACITY", "TokenCounts", "estimate_tokens"]

CAPACITY = 16_384


def estimate_tokens(text: object, max_tokens: int) -> int:
    """About how many tokens ``text`` takes, special tokens included, at most ``max_tokens``.

    Anything but a string counts 1 (the model refuses it in its pass).
    """
    if not isinstance(text, str):
        return 1
    n = 2 + (len(text) * 2) // 9
    return n if n < max_tokens else max_tokens


class TokenCounts:
    """Tokens per text, remembered for the most recent :data:`CAPACITY` texts."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._table: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity

    def remember(self, texts: Sequence[str], counts: Sequence[int]) -> None:
        """Record ``counts[i]`` as the tokens of ``texts[i]``."""
        with self._lock:
            table = self._table
            for text, n in zip(texts, counts, strict=True):
                key = (hash(text), len(text))
                table[key] = n
                table.move_to_end(key)
            while len(table) > self._capacity:
                table.popitem(last=False)

    def get(self, texts: Sequence[str], tokenize: Callable[[list[str]], list[int]]) -> list[int]:
        """Tokens per text: remembered ones from memory, the others from ``tokenize``."""
        out: list[int | None] = []
        with self._lock:
            for text in texts:
                out.append(self._table.get((hash(text), len(text))))
        missing = [i for i, n in enumerate(out) if n is None]
        if missing:
            counted = tokenize([texts[i] for i in missing])
            for i, n in zip(missing, counted, strict=True):
                out[i] = n
        return [n or 0 for n in out]
