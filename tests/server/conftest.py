"""Fixtures for the server tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_helpers import ServerProcess, server_process

from batchserve.engines.loader import load_model
from batchserve.models.loader import LoadedModel


@pytest.fixture(scope="session")
def minilm_server() -> Iterator[ServerProcess]:
    """One real server with the built-in MiniLM on torch float32 for the whole session.

    It loads in ~10 s. Pinned to torch, the reference, so its answers can be held to
    torch's own to 0.9999; the default ``--backend auto`` has a server of its own
    (``test_engine_choice.py``).
    """
    pytest.importorskip("sentence_transformers")
    start = time.monotonic()
    with server_process(["--max-wait", "2ms", "--backend", "torch"]) as server:
        server.load_s = time.monotonic() - start  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="session")
def reranker(reranker_folder: Path) -> LoadedModel:
    """The test reranker on torch, one thread, loaded once for the in-process protocol tests."""
    return load_model(f"{reranker_folder}:backend=torch,threads=1")


@pytest.fixture(scope="session")
def classifier(classifier_folder: Path) -> LoadedModel:
    """The test classifier on torch, one thread."""
    return load_model(f"{classifier_folder}:backend=torch,threads=1")
