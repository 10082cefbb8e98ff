"""Fixtures shared across the suite's folders (a plugin, ``-p engine_fixtures``): one cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchserve.engines import telemetry
from batchserve.engines.quality_set import load as load_quality_set

# Tests import OpenVINO directly too (importorskip): no usage report from the suite either.
telemetry.decline()


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache folder of exports, gate figures and ``auto`` verdicts for the session.

    Exports take seconds each; the tests that export, gate or choose share them here.
    """
    return tmp_path_factory.mktemp("engine-cache")


@pytest.fixture(scope="session")
def small_quality_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A slice of the shipped quality set (every retrieval pair, ~100 texts), as a file.

    The gate's figures on it are close to the full set's (``batchserve profile --backends``
    gives those); a test that gates on it takes seconds instead of a minute.
    """
    qs = load_quality_set()
    step = len(qs.texts) // 100
    path = tmp_path_factory.mktemp("quality-set") / "small.json"
    data = {
        "texts": list(qs.texts[::step]),
        "queries": list(qs.queries),
        "passages": list(qs.passages),
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def engine_env(engine_cache: Path, small_quality_set: Path) -> dict[str, str]:
    """The environment that points a server or a load at the session's cache and set."""
    return {
        "BATCHSERVE_CACHE_DIR": str(engine_cache),
        "BATCHSERVE_QUALITY_SET": str(small_quality_set),
    }


def build_sequence_folder(
    path: Path, *, labels: tuple[str, ...] = ("LABEL_0",), seed: int = 0, layers: int = 2
) -> Path:
    """A small ``BertForSequenceClassification`` saved in ``path`` with MiniLM's tokenizer.

    Random weights (``seed``), a 32-wide two-layer encoder: one label makes a reranker, more
    a classifier (``labels`` become ``id2label``). The real loading and serving code runs
    on it; its scores mean nothing, but they are deterministic and differ between inputs.
    """
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from batchserve.engines.embeddings import builtin_path

    tokenizer = AutoTokenizer.from_pretrained(str(builtin_path()), local_files_only=True)
    config = BertConfig(  # type: ignore[call-arg]
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def reranker_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small reranker folder (one label), built once per session."""
    pytest.importorskip("transformers")
    return build_sequence_folder(tmp_path_factory.mktemp("models") / "tiny-reranker")


@pytest.fixture(scope="session")
def classifier_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small classifier folder (labels ``negative``, ``neutral``, ``positive``)."""
    pytest.importorskip("transformers")
    return build_sequence_folder(
        tmp_path_factory.mktemp("models") / "tiny-classifier",
        labels=("negative", "neutral", "positive"),
        seed=1,
    )


class Zoo:
    """The zoo's folders (``tests/zoo.py``), each built the first time a test asks for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, Path] = {}

    def folder(self, name: str) -> Path:
        """The folder of the zoo's spec ``name``, built once per session."""
        import zoo

        if name not in self._built:
            spec = next(s for s in zoo.ZOO if s.name == name)
            self._built[name] = zoo.build(spec, self.root)
        return self._built[name]


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    """The zoo of tiny embedding folders of every family, pooling and layout."""
    pytest.importorskip("sentence_transformers")
    return Zoo(tmp_path_factory.mktemp("zoo"))


@pytest.fixture(scope="session")
def colbert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random-weight ColBERT folder as PyLate saves it (``colbert_folder.build``)."""
    import colbert_folder

    return colbert_folder.build(tmp_path_factory.mktemp("colbert"))


@pytest.fixture(scope="session")
def pylate_colbert(colbert_dir: Path) -> object:
    """PyLate's own ``ColBERT`` of :func:`colbert_dir`: the reference in-process."""
    import colbert_folder

    return colbert_folder.reference(colbert_dir)
