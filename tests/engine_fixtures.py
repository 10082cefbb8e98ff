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
