"""The edge texts: built from the folder, and an engine wrong on one of them is named and refused.

The two mistakes of the issue that the mean hid, made on purpose on the torch engine of zoo
folders: a text stripped before tokenizing (a byte-level BPE tokenizer then sees other
tokens) and a window cut short. Each passes on most texts, misses the library on one edge
text, and the gate says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sentence_transformers")

from batchserve.engines import edges
from batchserve.engines.embeddings import on_torch
from batchserve.engines.gate import gate_named
from batchserve.engines.hardware import Engine
from batchserve.engines.pipeline import TextPipeline
from batchserve.engines.runtime import Runtime
from batchserve.errors import ConfigError
from engine_fixtures import Zoo

FLOAT32 = Engine("onnx", "float32")


class Stripping:
    """An engine that strips each text first, as the exported engines did."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def __call__(self, texts: Sequence[str]) -> Any:
        return self.engine([t.strip() for t in texts])


def test_the_set_reaches_each_edge_of_the_folder(zoo: Zoo) -> None:
    pipeline = TextPipeline.read(zoo.folder("modernbert-8192"))
    items = edges.edge_texts(pipeline)
    labels = [i.label for i in items]
    lengths = dict(zip(labels, pipeline.untruncated([i.text for i in items]), strict=True))
    over = next(label for label in labels if label.startswith("a text longer than the window"))
    assert lengths[over] > 8192
    mid = next(label for label in labels if "over 512, within the window" in label)
    assert 512 < lengths[mid] <= 8192
    assert {"the empty string", "a text with spaces around it"} <= set(labels)
    assert sum(label.endswith(" text") and label.startswith("a ") for label in labels) >= 10
    # the default prompt (a request naming none) and each named one
    named = {i.prompt_name for i in items}
    assert named == {None, "query", "passage", "document"}  # sentence-transformers 6 adds ""
    prompted = edges.inputs(items, pipeline)
    assert prompted[labels.index("a query with prompt 'query'")].startswith("query: ")


def test_an_engine_that_strips_misses_the_text_with_spaces_around_it(
    zoo: Zoo, tmp_path: Path
) -> None:
    folder = zoo.folder("roberta-max")  # byte-level BPE: spaces are tokens
    engine = on_torch(folder, Runtime(backend="torch", threads=1))
    right = edges.check(folder, Engine("torch", "float32"), engine, tmp_path)
    assert right.passes
    assert right.min_cosine >= 0.9999
    wrong = edges.check(folder, FLOAT32, Stripping(engine), tmp_path)
    assert not wrong.passes
    assert wrong.worst.startswith("a text with ")
    assert wrong.min_cosine < 0.999
    # kept with the engine's figures: read back, not measured again
    assert edges.check(folder, FLOAT32, engine, tmp_path) == wrong
    # named at float32 it is refused, the text and the figure given
    with pytest.raises(ConfigError) as info:
        gate_named(folder, Engine("onnx", "float32"), Stripping(engine), tmp_path / "other")
    message = str(info.value)
    assert "backend onnx at float32 does not give roberta-max's vectors" in message
    assert f"cosine to sentence-transformers on {wrong.worst} must be >= 0.9999" in message
    assert "serve it with --backend torch" in message


def test_an_engine_that_cuts_the_window_short_misses_the_longest_text(
    zoo: Zoo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = zoo.folder("mpnet-weightedmean-dense")  # a window of 512 tokens
    short = on_torch(folder, Runtime(backend="torch", threads=1))
    short.tokenizer.model_max_length = 128  # as min(model_max_length, 512) did to 8,192
    figures = edges.check(folder, FLOAT32, short, tmp_path)
    assert figures.worst.startswith("a text longer than the window")
    assert not figures.passes
    # a half-precision torch engine named on purpose is served, with the figure in the log
    served = gate_named(folder, Engine("torch", "bfloat16-mixed"), short, tmp_path)
    assert served["edges"]["passes"] is False
    assert "served as asked, but --backend auto would not choose it" in caplog.text
