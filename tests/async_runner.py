"""The suite's one async runner, loaded as a plugin (``-p async_runner`` in pyproject.toml).

Every ``async def test_*`` runs on asyncio through anyio's pytest plugin (installed with
anyio), so no test module writes its own ``asyncio.run`` wrapper. Two kinds of code still
call ``asyncio.run``: a script run in a fresh interpreter (``test_tracing.py``), and the
slow Ray tests, whose load runs beside Ray Serve's blocking API (``serve.run``,
``serve.status``) that must not run on the test's own loop.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio, the loop the server and the batcher run on."""
    return "asyncio"
