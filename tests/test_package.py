"""The package's shape: the public API is exactly what __all__ says; the core is layered."""

import ast
import pathlib
import types

import batchserve

SRC = pathlib.Path(batchserve.__file__).parent
CORE = [
    "errors.py",
    "config.py",
    "clock.py",
    "costmodel.py",
    "bisection.py",
    "units.py",
    "batcher.py",
    "decorator.py",
    "policy",
    "models",
]
OUTER = ("server", "loadgen", "sim", "metrics", "cli", "demo", "report", "tuning", "profiling")


def test_public_api_is_exactly_all() -> None:
    # Submodules become attributes of the package once anything imports them (other tests
    # import batchserve.server, batchserve.cli...): they are not part of the public names.
    public = {
        n
        for n, v in vars(batchserve).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    }
    assert public | {"__version__"} == set(batchserve.__all__)


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_core_imports_nothing_from_the_outer_layers() -> None:
    files: list[pathlib.Path] = []
    for entry in CORE:
        p = SRC / entry
        files.extend(p.rglob("*.py") if p.is_dir() else [p])
    assert len(files) > 10
    for f in files:
        for name in _imports(f):
            parts = name.split(".")
            if parts[0] == "batchserve" and len(parts) > 1:
                assert parts[1] not in OUTER, f"{f.relative_to(SRC)} imports {name}"


def test_the_policy_reads_no_clock_and_does_no_io() -> None:
    # Both drivers (the batcher, the simulator) hand the policy its time: no module of it,
    # the classes-of-work ones included, may read a clock or touch I/O itself.
    files = sorted((SRC / "policy").glob("*.py"))
    assert {f.name for f in files} >= {"core.py", "mixed.py", "lanes.py", "classes.py"}
    for f in files:
        banned = {n.split(".")[0] for n in _imports(f)} & {
            "time", "asyncio", "socket", "threading", "random", "os",
        }  # fmt: skip
        assert not banned, f"policy/{f.name} imports {sorted(banned)}"
