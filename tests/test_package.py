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


#: The request's path: it must not depend on the views of the server built on its counters.
HOT_PATH = ["server/wire.py", "server/exchange.py", "batcher.py", "policy/core.py"]
VIEWS = (
    "batchserve.server.triton",
    "batchserve.server.status",
    "batchserve.server.dashboard",
    "batchserve.server.openapi_ops",
    "batchserve.cli.top",
)


def test_the_hot_path_and_the_metrics_import_none_of_the_views() -> None:
    for entry in [*HOT_PATH, "metrics.py"]:
        for name in _imports(SRC / entry):
            assert not any(name == v or name.startswith(v + ".") for v in VIEWS), (entry, name)
    # The metrics are read by the server's views; they know nothing of HTTP.
    assert not any(n.startswith("batchserve.server") for n in _imports(SRC / "metrics.py"))
