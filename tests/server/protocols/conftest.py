"""The tiny reranker and classifier, loaded once for the protocol tests that run them
in-process (``test_tasks.py``, ``test_pipeline_clients.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchserve.engines.loader import load_model
from batchserve.models.loader import LoadedModel


@pytest.fixture(scope="session")
def reranker(reranker_folder: Path) -> LoadedModel:
    """The test reranker on torch, one thread."""
    return load_model(f"{reranker_folder}:backend=torch,threads=1")


@pytest.fixture(scope="session")
def classifier(classifier_folder: Path) -> LoadedModel:
    """The test classifier on torch, one thread."""
    return load_model(f"{classifier_folder}:backend=torch,threads=1")
