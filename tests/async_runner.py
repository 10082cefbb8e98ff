"""The suite's one async runner, loaded as a plugin (``-p async_runner`` in pyproject.toml).

Every ``async def test_*`` runs on asyncio through anyio's pytest plugin (installed with
anyio), so no test module writes its own ``asyncio.run`` wrapper.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio, the loop the server and the batcher run on."""
    return "asyncio"
