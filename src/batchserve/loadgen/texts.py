"""Input texts for load runs: read from a file, or generated at a given length.

Generated texts are drawn from a fixed list of common English words, one model token each
for a WordPiece or BPE vocabulary (so ``words`` is close to the number of tokens), with a
seeded generator: the same arguments always give the same texts. Real text of a realistic
length mix, which ships with every Python, is :func:`reference_paragraphs` (the paragraphs
of Python's reference manual; see :mod:`batchserve.engines.corpus`, where ``--backend auto``
reads it too).
"""

from __future__ import annotations

import random
from pathlib import Path

from batchserve.engines.corpus import reference_paragraphs
from batchserve.errors import ConfigError

__all__ = ["generate_texts", "read_texts", "reference_paragraphs"]

_WORD_TEXT = (
    "the of and to in is was for that on as with by he at from his an were are which this "
    "be or had not but first one their its new after who they two her she been other when "
    "there all during into school time may years more most only over city some world would "
    "where later up such used many can state about national out known university united "
    "then made also three system since season part under team before being these through "
    "north second both between south film well early number while people each year name "
    "county following war including american back around called world game music because "
    "until against same several four local group however made played high family local "
    "water house own long work life music small government public show line based club "
    "series west east book park river road church area album last great place did make "
    "along left found good company could law york history three became end way best next "
    "set day home general old john power even around age five war river light still"
)
_WORDS = tuple(sorted(set(_WORD_TEXT.split())))


def generate_texts(count: int, *, words: int | tuple[int, int], seed: int = 0) -> tuple[str, ...]:
    """``count`` texts of ``words`` words each, the same for the same arguments.

    ``words`` is a number, or a range ``(low, high)``: each text's length is drawn uniformly
    from it, both ends included (a mix of short queries and passages).

    Raises:
        ConfigError: ``count`` or a length is below 1, or a range runs backwards.
    """
    if count < 1:
        raise ConfigError(f"count must be >= 1, got {count}")
    low, high = words if isinstance(words, tuple) else (words, words)
    if low < 1:
        raise ConfigError(f"words must be >= 1, got {low}")
    if high < low:
        raise ConfigError(f"words must be LOW:HIGH with LOW <= HIGH, got {low}:{high}")
    rng = random.Random(seed)
    return tuple(
        " ".join(rng.choices(_WORDS, k=rng.randint(low, high) if high > low else low))
        for _ in range(count)
    )


def read_texts(path: str | Path) -> tuple[str, ...]:
    """The non-blank lines of a UTF-8 file, stripped, one text each.

    Raises:
        ConfigError: the file cannot be read or holds no text.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"texts file {str(path)!r} cannot be read: {exc}") from None
    texts = tuple(line.strip() for line in lines if line.strip())
    if not texts:
        raise ConfigError(f"texts file {str(path)!r} must hold at least one non-blank line")
    return texts
