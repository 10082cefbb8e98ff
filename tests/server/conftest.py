"""Fixtures for the server tests."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from server_helpers import ServerProcess, server_process


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
