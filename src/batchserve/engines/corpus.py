"""Real text of a realistic length mix that every machine has: Python's reference manual.

CPython ships the text of its language reference's topics (``pydoc_data.topics``, what
``help("if")`` prints) with every installation. :func:`reference_paragraphs` cuts it into
paragraphs: the blocks between blank lines, headings and bare rules left out, each block's
whitespace collapsed to single spaces, duplicates dropped, in a fixed order (topics by
name, blocks in their order). On CPython 3.11 that is 1,863 paragraphs, prose and the
indented grammar rules and examples alike, of 48.6 tokens on average for all-MiniLM-L6-v2
(median 35, 90th percentile 101, a tail to the 256-token cap): the long-tailed mix of a
technical manual an indexer embeds, with many paragraphs on close topics.

It is the benchmarks' realistic mix (``bench/models/pass_breakdown.py``,
``bench/models/served_engines.py``)
and what ``--backend auto`` times the engines on (:mod:`batchserve.engines.choice`). The
text depends on the Python version; :func:`digest` names the version read.
"""

from __future__ import annotations

import functools
import hashlib
import re

__all__ = ["digest", "reference_paragraphs"]

_BLANK = re.compile(r"\n[ \t]*\n")
_UNDERLINE = frozenset("*=-~^")


@functools.cache
def reference_paragraphs() -> tuple[str, ...]:
    """The paragraphs of Python's reference manual topics, in a fixed order (see above).

    Raises:
        ImportError: this Python was installed without ``pydoc_data`` (some distributions
            split it out).
    """
    from pydoc_data.topics import topics

    seen: set[str] = set()
    out: list[str] = []
    for key in sorted(topics):
        for block in _BLANK.split(topics[key]):
            lines = block.strip().splitlines()
            if not lines:
                continue
            if len(lines) >= 2 and set(lines[-1].strip()) <= _UNDERLINE:
                continue  # a heading and its underline
            text = " ".join(block.split())
            if any(c.isalnum() for c in text) and text not in seen:
                seen.add(text)
                out.append(text)
    return tuple(out)


def digest() -> str:
    """A short hash of :func:`reference_paragraphs` (16 hex), for cache keys."""
    h = hashlib.sha256()
    for text in reference_paragraphs():
        h.update(text.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
