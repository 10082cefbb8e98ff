"""Token counts: a cheap estimate before a pass, and a memory of the real counts after it.

:func:`estimate_tokens` sizes a text for batches formed by tokens on the event loop, where a
real tokenization (tens of microseconds) would cost more than the request's own path: about
4.5 characters per WordPiece token of English, measured on the quality set (the real count
over the estimate: mean 1.01, 90% of texts within 0.83-1.33).

:class:`TokenCounts` is a small bounded memory, so OpenAI's ``usage`` costs no second
tokenization.

Theory of operation: an engine records the tokens of each item it just ran (from the
attention mask of the pass), keyed by the item's text (a pair's two texts joined) through
its hash and length; :meth:`TokenCounts.recall` answers from that memory (None for a text
it does not hold), and :meth:`TokenCounts.get` calls the given tokenizer for those.
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

    def recall(self, texts: Sequence[str]) -> list[int | None]:
        """Tokens per text remembered; None for a text not remembered."""
        with self._lock:
            table = self._table
            return [table.get((hash(text), len(text))) for text in texts]

    def get(self, texts: Sequence[str], tokenize: Callable[[list[str]], list[int]]) -> list[int]:
        """Tokens per text: remembered ones from memory, the others from ``tokenize``."""
        out = self.recall(texts)
        missing = [i for i, n in enumerate(out) if n is None]
        if missing:
            counted = tokenize([texts[i] for i in missing])
            for i, n in zip(missing, counted, strict=True):
                out[i] = n
        return [n or 0 for n in out]
