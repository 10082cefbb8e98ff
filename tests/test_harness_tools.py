"""The outside programs: the set-up installs what the suite needs; a missing one fails loudly.

``scripts/install-tools`` installs them (``scripts/test`` runs it with no argument);
``batchserve_testing.tools`` only finds them. A test that needs a missing program must fail
and name the command that installs it, never skip.
"""

from __future__ import annotations

import pathlib
import re
import shutil

import pytest

from batchserve_testing import tools

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "scripts" / "install-tools").read_text()
FINDERS = {
    name: getattr(tools, name)
    for name in dir(tools)
    if name.startswith("find_") and name != "find_binary"
}


def _missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> dict[str, tools.MissingTool]:
    """What each finder raises on a machine that has none of the programs."""
    monkeypatch.setattr(shutil, "which", lambda *_, **__: None)
    monkeypatch.setattr(tools, "PERF_ANALYZER_HOME", tmp_path / "perf_analyzer")
    raised: dict[str, tools.MissingTool] = {}
    for name, finder in FINDERS.items():
        with pytest.raises(tools.MissingTool) as caught:
            finder()
        raised[name] = caught.value
    return raised


def test_a_missing_program_fails_and_names_the_command_that_installs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    raised = _missing(monkeypatch, tmp_path)
    assert set(raised) >= {"find_nginx", "find_chromium", "find_promtool", "find_perf_analyzer"}
    for name, error in raised.items():
        # A RuntimeError fails the test; pytest's skip is an exception of another tree.
        assert not isinstance(error, pytest.skip.Exception), name
        assert f"run `scripts/install-tools {error.tool}`" in str(error), name


def test_the_set_up_knows_every_program_the_harness_looks_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    known = set(re.findall(r"^    (\w+)\) ", SCRIPT, re.MULTILINE))
    (default,) = re.findall(r"^\[.*\] \|\| tools=\(([^)]*)\)$", SCRIPT, re.MULTILINE)
    raised = _missing(monkeypatch, tmp_path)
    assert {e.tool for e in raised.values()} <= known
    # What the tests use, scripts/test installs (its call takes no argument: the default).
    used = {
        m
        for f in ROOT.joinpath("tests").rglob("*.py")
        for m in re.findall(r"\b(find_\w+)\(", f.read_text())
        if m in raised
    }
    used |= {"find_nginx"}  # through batchserve_testing.fleet, by the fleet tests
    assert {raised[m].tool for m in used} <= set(default.split()), used
