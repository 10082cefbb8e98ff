"""The shipped quality set: the file is what build() makes, and it is big and varied enough."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from batchserve.engines import quality_set
from batchserve.errors import ConfigError


def test_the_shipped_file_is_what_build_makes() -> None:
    assert quality_set.load() == quality_set.build()


def test_at_least_1000_texts_from_one_word_to_long_passages() -> None:
    qs = quality_set.load()
    words = [len(t.split()) for t in qs.texts]
    assert len(qs.texts) >= 1000
    assert min(words) == 1
    assert max(words) >= 150
    assert sum(w <= 8 for w in words) >= 200  # short queries
    assert sum(w >= 60 for w in words) >= 200  # multi-sentence passages
    assert 10 <= statistics.median(words) <= 60
    assert len(set(qs.texts)) >= 0.95 * len(qs.texts)


def test_the_retrieval_set_ranks_queries_against_distinct_passages() -> None:
    qs = quality_set.load()
    assert len(qs.queries) >= 50
    assert len(qs.passages) >= 100
    assert len(set(qs.passages)) == len(qs.passages)


def test_read_takes_json_or_lines(tmp_path: Path) -> None:
    lines = tmp_path / "texts.txt"
    lines.write_text("one\n\ntwo words\n", encoding="utf-8")
    assert quality_set.read(lines).texts == ("one", "two words")
    assert quality_set.read(lines).queries == ()
    js = tmp_path / "set.json"
    js.write_text(json.dumps({"texts": ["a"], "queries": ["q"], "passages": ["p"]}))
    assert quality_set.read(js) == quality_set.QualitySet(
        texts=("a",), queries=("q",), passages=("p",)
    )
    js.write_text(json.dumps({"texts": ["a", 3]}))
    with pytest.raises(ConfigError, match="texts must be a list of strings"):
        quality_set.read(js)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ConfigError, match="texts must be non-empty"):
        quality_set.read(tmp_path / "empty.txt")
