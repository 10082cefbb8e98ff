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
import random
import re

__all__ = ["SPEED_REQUESTS", "digest", "reference_paragraphs", "speed_texts"]

_BLANK = re.compile(r"\n[ \t]*\n")
_UNDERLINE = frozenset("*=-~^")
#: Requests each worker times per round (of the batch size each).
SPEED_REQUESTS = 2


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


def speed_texts(
    batch_size: int, workers: int, *, requests: int = SPEED_REQUESTS
) -> list[list[str]]:
    """The requests the engines are timed on: ``requests`` per worker, ``batch_size`` texts each.

    A seeded sample of the reference manual's paragraphs
    (:func:`~batchserve.engines.corpus.reference_paragraphs`), each request of mixed
    lengths as an indexer's are (a long tail: 48 tokens mean, 101 at the 90th percentile),
    so that an engine's time includes what its sub-passes save of the padding. The same
    arguments give the same requests.
    """
    paragraphs = list(reference_paragraphs())
    random.Random(0).shuffle(paragraphs)
    count = batch_size * max(1, workers) * max(1, requests)
    sample = [paragraphs[i % len(paragraphs)] for i in range(count)]
    return [sample[i : i + batch_size] for i in range(0, count, batch_size)]
