"""Fixtures for the server tests."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from server_helpers import ServerProcess, server_process


@pytest.fixture(scope="session")
def minilm_server() -> Iterator[ServerProcess]:
    """One real server with the built-in MiniLM for the whole session (it loads in ~10 s)."""
    pytest.importorskip("sentence_transformers")
    start = time.monotonic()
    with server_process(["--max-wait", "2ms"]) as server:
        server.load_s = time.monotonic() - start  # type: ignore[attr-defined]
        yield server
