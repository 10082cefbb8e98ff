"""Every bench script starts as the README runs it: by path, from the repository root.

Run as a fresh clone runs them: the tests' own directories are not on the path. Scripts
live in folders by what they measure (``bench/<group>/<script>.py``). No script imports
from ``tests/`` or edits ``sys.path``: what both need is in ``batchserve_testing``
(``batchserve_testing.bench`` for the bench), and a script's own folder is on the path when
it runs by path (so ``bench/peers/compare.py`` imports its program, the package
``bench/peers/comparison/``, and ``token_batching.py`` the same package's modules).
"""

from __future__ import annotations

import argparse
import ast
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
#: The folders, by what their scripts measure.
GROUPS = {"apps", "server", "scenarios", "fleets", "models", "peers", "tools", "gpu"}
#: Scripts that are modules for other programs, not commands (an ASGI server imports it).
MODULES = {"apps/null_app.py"}
#: Packages of a group's folder: the program behind one of its scripts, whose modules are
#: imported by its scripts and never run by path (``peers/comparison/``, behind
#: ``peers/compare.py``).
PACKAGES = sorted(
    str(p.parent.relative_to(BENCH))
    for p in BENCH.glob("*/*/__init__.py")
    if ".venvs" not in p.parts
)


def _runs_in_a_peer_venv(path: pathlib.Path) -> bool:
    """A peer's own script: it runs in ``bench/.venvs/<peer>``, with packages ours lacks."""
    return path.parent.name == "peers" and (
        path.name.endswith("_server.py") or path.name == "fastembed_encode.py"
    )


SCRIPTS = sorted(
    str(p.relative_to(BENCH))
    for p in BENCH.glob("*/*.py")
    if not p.name.startswith("_")
    and str(p.relative_to(BENCH)) not in MODULES
    and not _runs_in_a_peer_venv(p)
)


def test_every_script_is_in_a_folder_named_for_what_it_measures() -> None:
    loose = sorted(p.name for p in BENCH.glob("*.py"))
    assert not loose, f"scripts at bench/'s top level: {loose}"
    folders = {p.parent.name for p in BENCH.glob("*/*.py")} - {".venvs"}
    assert folders <= GROUPS, f"folders the README does not explain: {folders - GROUPS}"


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    tests = ROOT / "tests"
    kept = [
        p
        for p in env.get("PYTHONPATH", "").split(os.pathsep)
        if p and not pathlib.Path(p).resolve().is_relative_to(tests)
    ]
    env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def test_every_script_is_listed_in_the_bench_readme() -> None:
    readme = (BENCH / "README.md").read_text()
    missing = [s for s in SCRIPTS if f"`{s}`" not in readme]
    missing += [m for m in MODULES if f"`{m}`" not in readme]
    missing += [f"{p}/" for p in PACKAGES if f"`{p}/`" not in readme]
    assert not missing, f"bench/README.md's table has no line for {missing}"


def readme_commands() -> list[str]:
    """The command column of bench/README.md's table, one command a row that has one."""
    found = []
    for line in (BENCH / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[3].startswith("`") and cells[3].endswith("`"):
            found.append(cells[3].strip("`"))
    return found


def test_every_command_in_the_readme_names_a_script_and_flags_it_defines() -> None:
    commands = readme_commands()
    assert len(commands) >= len(SCRIPTS)
    for command in commands:
        argv = shlex.split(command.replace("[", " ").replace("]", " "))
        if argv[0] == "batchserve":  # the CLI: its own parser says whether the line parses
            from batchserve.cli import build_parser

            parser = build_parser()
            parser.exit_on_error = False
            try:
                parser.parse_args(argv[1:])
            except (SystemExit, argparse.ArgumentError) as exc:
                raise AssertionError(f"bench/README.md: {command}: {exc}") from exc
            continue
        scripts = [a for a in argv if a.startswith("bench/") and a.endswith(".py")]
        if not scripts:
            continue  # e.g. granian importing an app
        script = ROOT / scripts[0]
        assert script.is_file(), f"bench/README.md: {command}: no {scripts[0]}"
        source = _with_its_packages(script)
        if argv[0] != "python":  # a peer's script: its flags are in its venv's _common.py
            source += (script.parent / "_common.py").read_text()
        for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
            assert f'"{flag}"' in source, f"bench/README.md: {scripts[0]} defines no {flag}"


def _with_its_packages(script: pathlib.Path) -> str:
    """A script's source, and that of every package of its folder it imports (its flags)."""
    source = script.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            package = script.parent / node.module.split(".")[0]
            if (package / "__init__.py").is_file():
                source += "".join(p.read_text() for p in sorted(package.glob("*.py")))
    return source


def test_the_packages_are_programs_behind_scripts_not_scripts() -> None:
    assert PACKAGES == ["peers/comparison"]
    for package in PACKAGES:
        for module in sorted((BENCH / package).glob("*.py")):
            tree = ast.parse(module.read_text())
            mains = [
                n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)
            ]
            assert not mains, f"{module.relative_to(ROOT)} runs as a script: run its entry point"


#: Modules of tests/, by the names a script would import them under.
TEST_MODULES = {p.stem for p in (ROOT / "tests").rglob("*.py")} - {"__init__", "conftest"}


def test_no_script_imports_from_tests_or_edits_the_path() -> None:
    # The peers' virtualenvs (bench/.venvs, git-ignored) hold other people's code.
    ours = (p for p in BENCH.rglob("*.py") if ".venvs" not in p.relative_to(BENCH).parts)
    for path in sorted(ours):
        source = path.read_text()
        assert "sys.path" not in source, f"{path.name} edits sys.path"
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in TEST_MODULES, f"{path.name} imports {name}"


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module and its classes and functions."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_no_script_reaches_into_tests_by_path() -> None:
    # Running a file of tests/ by path is a dependency as much as importing it is. A
    # docstring may still name where a test lives.
    ours = (p for p in BENCH.rglob("*.py") if ".venvs" not in p.relative_to(BENCH).parts)
    for path in sorted(ours):
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in docs:
                    continue
                parts = node.value.replace("\\", "/").split("/")
                assert "tests" not in parts, f"{path.name}:{node.lineno} names {node.value!r}"


#: Words of a verdict against a target: a benchmark prints what it measured, and what a
#: figure should be is an issue's to say (so no script quotes an issue's target either).
VERDICT = re.compile(r"\b(met|missed|meets|misses|targets?)\b", re.IGNORECASE)


def test_no_script_prints_a_verdict_or_quotes_a_target() -> None:
    ours = (p for p in BENCH.rglob("*.py") if ".venvs" not in p.relative_to(BENCH).parts)
    for path in sorted(ours):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found = VERDICT.search(node.value)
                assert found is None, f"{path.name}:{node.lineno} says {found.group()!r}"


#: Subcommands of a script, each with a ``--help`` of its own.
SUBCOMMANDS = ["peers/compare.py report", "peers/compare.py servers"]


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS + SUBCOMMANDS)
def test_every_script_answers_help_from_the_repository_root(script: str) -> None:
    path, *words = script.split()
    done = subprocess.run(
        [sys.executable, f"bench/{path}", *words, "--help"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def test_the_yardstick_encode_alone_times_its_batches_after_the_warm_up() -> None:
    # The one "encode alone" every throughput script states its ratios against.
    from batchserve_testing import encode_alone

    seen: list[list[str]] = []
    once = encode_alone.rate(seen.append, encode_alone.cut("abcde", 2), warm=1)
    assert seen == [["a", "b"], ["a", "b"], ["c", "d"], ["e"]]  # warm-up, then one pass
    assert (once.items, once.calls) == (5, 3)
    assert once.items_per_s == once.items / once.seconds
    seen.clear()
    timed = encode_alone.rate(seen.append, [["x"]], seconds=0.0, warm=0)
    assert (seen, timed.calls) == ([["x"]], 1)  # checked after each call: at least one
    assert encode_alone.windows("abc", 2) == [["a", "b"], ["c", "a"], ["b", "c"]]
    with pytest.raises(ValueError, match="at least one batch"):
        encode_alone.rate(seen.append, [])
