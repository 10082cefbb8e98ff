"""``batchserve profile`` of a reranker folder: the cost per (query, passage) pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchserve.cli import main
from batchserve.cli import profile as profile_cli
from batchserve.models import profiling


def test_profile_of_a_reranker_measures_pairs(
    reranker_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Any] = []
    real = profiling.profile_model

    def spy(fn: Any, **kw: Any) -> Any:
        seen.extend(kw["inputs"])
        return real(fn, **kw)

    monkeypatch.setattr(profile_cli, "profile_model", spy)
    out = tmp_path / "profile.json"
    spec = f"{reranker_folder}:backend=torch,threads=1"  # the cost of pairs, not auto
    argv = ["profile", "--model", spec, "--sizes", "1,4,8", "--repeats", "2", "-o", str(out)]
    assert main(argv) == 0
    profile = json.loads(out.read_text())
    assert [p[0] for p in profile["points"]] == [1, 4, 8]
    # Every size was timed; the fit is a cost, never negative. (Its slope is not asserted:
    # on a busy machine three sizes timed twice can fit a pass's cost as all fixed.)
    assert all(p[1] > 0 for p in profile["points"])
    assert profile["per_item_s"] >= 0
    assert profile["fixed_s"] + 8 * profile["per_item_s"] > 0
    assert "profile of" in capsys.readouterr().out
    assert seen
    assert all(isinstance(i, tuple) and i[0] == profile_cli.PROFILE_QUERY for i in seen)
