"""The package's shape: the public API is exactly what __all__ says; the core is layered.

The test and bench harness (``harness/``, :mod:`batchserve_testing`) is the repository's, not
the package's: it may import batchserve, batchserve never imports it, and no wheel holds it.
"""

import ast
import functools
import os
import pathlib
import shutil
import subprocess
import sys
import types
import zipfile

import batchserve

SRC = pathlib.Path(batchserve.__file__).parent
ROOT = SRC.parents[1]
HARNESS = ROOT / "harness" / "batchserve_testing"

#: Every top-level module and subpackage, by layer, lowest first. A module may import from
#: its own layer and the layers before it, never from a later one; the two drivers do not
#: import each other. ``ls src/batchserve`` has nothing that is not listed here. The core
#: holds the model protocol and the models that need no engine (``models``); what picks,
#: exports, gates and runs an engine is a layer of its own above it (``engines``), which
#: the drivers load through.
LAYERS: list[tuple[str, set[str]]] = [
    ("vocabulary", {"errors", "clock", "units", "config", "costmodel", "subpasses"}),
    ("core", {"policy", "models", "bisection", "batcher", "decorator", "workload"}),
    ("engines", {"engines"}),
    ("drivers", {"server", "sim"}),
    ("outer", {"loadgen", "integrations"}),
    ("shell", {"cli", "__main__"}),
]
LAYER_OF = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}
DRIVERS = LAYERS[3][1]


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


def _entries() -> list[pathlib.Path]:
    return [
        p
        for p in sorted(SRC.iterdir())
        if p.name not in {"__init__.py", "py.typed", "__pycache__"}
        and (p.suffix == ".py" or (p / "__init__.py").exists())
    ]


def test_every_module_has_a_layer() -> None:
    names = {p.stem if p.suffix == ".py" else p.name for p in _entries()}
    assert names == set(LAYER_OF), "unlisted or missing: " + str(names ^ set(LAYER_OF))


def test_every_module_imports_only_from_its_layer_and_below() -> None:
    checked = 0
    for entry in _entries():
        own = entry.stem if entry.suffix == ".py" else entry.name
        files = sorted(entry.rglob("*.py")) if entry.is_dir() else [entry]
        for f in files:
            checked += 1
            for name in _imports(f):
                parts = name.split(".")
                if parts[0] != "batchserve" or len(parts) == 1 or parts[1] == own:
                    continue
                used = parts[1]
                where = f"{f.relative_to(SRC)} imports {name}"
                assert LAYER_OF[used] <= LAYER_OF[own], where
                assert not (own in DRIVERS and used in DRIVERS), where
    assert checked > 60


def _layer(module: str) -> int:
    parts = module.split(".")
    # The package's front is the public API, which is the core's.
    return LAYER_OF[parts[1]] if len(parts) > 1 else LAYER_OF["batcher"]


def test_no_import_runs_up_a_layer_however_it_is_written() -> None:
    # The rule above, read on the whole graph: ``from batchserve import engines``, an import
    # inside a function and one under ``TYPE_CHECKING`` count. So the core never imports an
    # engine, however late or lazily, and an engine imports only the core and the vocabulary.
    upward = sorted(
        f"{module} imports {used}"
        for module, edges in _graph().items()
        for used in edges
        if _layer(used) > _layer(module)
    )
    assert not upward, upward
    assert _layer("batchserve.engines.loader") == _layer("batchserve.models.loader") + 1
    assert _layer("batchserve.engines.loader") == _layer("batchserve.server.app") - 1


def test_the_public_api_is_the_core() -> None:
    for name in _imports(SRC / "__init__.py"):
        parts = name.split(".")
        assert LAYER_OF[parts[1]] <= LAYER_OF["batcher"], name


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


#: The request's path: it must not depend on the views of the server built on its counters.
HOT_PATH = [
    "server/transport/httptools.py",
    "server/exchange.py",
    "batcher/engine.py",
    "batcher/answers.py",
    "batcher/threads.py",
    "policy/core.py",
    "policy/entries.py",
]
VIEWS = (
    "batchserve.server.protocols.triton",
    "batchserve.server.ops.live",
    "batchserve.server.ops.dashboard",
    "batchserve.server.ops.openapi",
    "batchserve.server.ops.docs_page",
    "batchserve.cli.top",
)


def test_the_hot_path_and_the_metrics_import_none_of_the_views() -> None:
    for entry in [*HOT_PATH, "server/ops/metrics.py", "server/account.py"]:
        for name in _imports(SRC / entry):
            assert not any(name == v or name.startswith(v + ".") for v in VIEWS), (entry, name)
    # The metrics and their account are read by the server's views; they know nothing of
    # HTTP (the metrics keep their account of the passes in ``server.account``).
    metrics = _imports(SRC / "server/ops/metrics.py")
    assert not any(
        n.startswith("batchserve.server") for n in metrics - {"batchserve.server.account"}
    )
    assert not any(n.startswith("batchserve.server") for n in _imports(SRC / "server/account.py"))


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Every module of batchserve and those of batchserve it imports, however it imports them.

    Imports inside functions and under ``TYPE_CHECKING`` count: a cycle that does not run at
    import time still ties the modules into one. ``from package import name`` is an edge to
    the submodule ``package.name`` when there is one, else to the package.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module in modules:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    edges.add(sub if sub in modules else node.module)
        graph[name] = edges - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere_type_only_imports_included() -> None:
    graph = _graph()
    assert len(graph) > 90
    assert graph["batchserve.server.app"]
    assert _cycles(graph) == []


def _server_imports(where: str) -> dict[str, set[str]]:
    """The server modules under ``where`` (a module or a subpackage) and their server imports."""
    prefix = f"batchserve.server.{where}".rstrip(".")
    found = {
        m: {n for n in edges if n.startswith("batchserve.server.")}
        for m, edges in _graph().items()
        if m == prefix or m.startswith(prefix + ".")
    }
    assert found, where
    return found


def test_the_server_is_laid_out_by_a_requests_life() -> None:
    # Each rule names the modules it binds; one that names a module no longer there fails
    # (``_server_imports``), so a rule cannot go quiet when the code moves.
    below = ("batchserve.server.transport", "batchserve.server.ops")
    # The exchange and the protocols are carried by any transport and watched by the
    # operations: they know neither (a second transport needs only the exchange).
    for where in ("exchange", "protocols", "http", "statuses", "deadlines", "account"):
        for module, imports in _server_imports(where).items():
            wrong = {n for n in imports if n.startswith(below)}
            assert not wrong, f"{module} imports {sorted(wrong)}"
    # The operations watch the server; no transport carries them.
    for module, imports in _server_imports("ops").items():
        wrong = {n for n in imports if n.startswith("batchserve.server.transport")}
        assert not wrong, f"{module} imports {sorted(wrong)}"
    # Nothing inside the server names the application's class but the process that runs it
    # and the package's front: a module needs a small Protocol of it (Host, Gate...).
    for module, imports in _server_imports("").items():
        if "batchserve.server.app" in imports:
            assert module in {"batchserve.server", "batchserve.server.run"}, module


def test_no_large_file_is_tracked() -> None:
    # Export steps (ONNX Runtime's shape inference, NNCF) write scratch files into the
    # working folder on failure; a 90 MB one once landed in a commit. Weights and exports
    # live in the cache, never in the repository: 4 MiB is four times the largest data
    # file the package ships (the reference embeddings, 1.9 MB).
    root = SRC.parent.parent
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.decode()
    large = sorted(
        name
        for name in listed.split("\0")
        if name and (root / name).is_file() and (root / name).stat().st_size > 4 << 20
    )
    assert not large, f"files over 4 MiB tracked by git: {large}"


def _top_level(name: str) -> str:
    return name.split(".")[0]


def test_the_harness_imports_batchserve_and_nothing_imports_the_harness_but_tests_and_bench() -> (
    None
):
    assert (HARNESS / "harness.py").exists()
    for f in sorted(SRC.rglob("*.py")):
        used = {_top_level(n) for n in _imports(f)}
        assert "batchserve_testing" not in used, f"{f.relative_to(SRC)} imports the harness"
    # The harness stands on batchserve alone: neither tests/ nor bench/ is on its path.
    tests = {p.stem for p in (ROOT / "tests").rglob("*.py")} - {"__init__", "conftest"}
    for f in sorted(HARNESS.rglob("*.py")):
        used = {_top_level(n) for n in _imports(f)}
        assert not used & (tests | {"bench", "tests"}), f"{f.name} imports {used & tests}"


def test_the_wheel_holds_batchserve_alone_no_harness_and_no_tool_installer(
    tmp_path: pathlib.Path,
) -> None:
    # The wheel ``pip install .`` installs, built from a copy of the working tree as git sees
    # it (what a clone holds, with the files not committed yet), so that a packaging setting
    # anywhere in the repository counts. About 2 s.
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    tree = tmp_path / "tree"
    for name in listed.split("\0"):
        if name and (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    wheel_cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*wheel_cmd, "-q", "-w", str(tmp_path / "out"), str(tree)],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_NO_INDEX": "1"},
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "out").glob("batchserve-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        tops = {n.split("/")[0] for n in names}
        assert tops == {"batchserve", wheel.name.split("-py3")[0] + ".dist-info"}, tops
        modules = [n for n in names if n.endswith(".py")]
        assert "batchserve/server/app.py" in modules
        assert not [n for n in names if n.startswith("batchserve/testing/")]
        # No module that installs a program (apt-get) or fetches one (pip download).
        for n in modules:
            text = z.read(n).decode()
            assert "apt-get" not in text, n
            assert "pip download" not in text, n


def _exchange_writes(source: str, where: str, slots: frozenset[str]) -> list[str]:
    """Where ``source`` (file ``where``) assigns, ``setattr``s or deletes an exchange's slot.

    An expression is taken for an exchange when its last name says so (``exchange``,
    ``self._exchange``, ``traced_exchange``...), when it is a name annotated with a type
    naming ``Exchange`` (a parameter, ``x: Exchange = ...``) or bound by a call that opens
    one (``.begin(...)``, ``Exchange(...)``, ``TracedExchange(...)``), or when it is ``self``
    in a class built on an ``...Exchange`` class.
    """
    tree = ast.parse(source)
    found: list[str] = []

    def last_name(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        return None

    def opens(value: ast.expr | None) -> bool:
        if not isinstance(value, ast.Call):
            return False
        name = last_name(value.func) or ""
        return name == "begin" or "exchange" in name.lower()

    def visit(node: ast.AST, known: frozenset[str], own: bool) -> None:
        if isinstance(node, ast.ClassDef):
            own = any("Exchange" in ast.unparse(b) for b in node.bases)
            known = frozenset()
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            annotated = {
                a.arg for a in every if a.annotation and "Exchange" in ast.unparse(a.annotation)
            }
            known = known | annotated | ({"self"} if own and every else set())
            # The names of the body that hold an exchange: annotated, or bound by a call
            # that opens one (a name is one object per function here).
            for sub in ast.walk(node):
                if isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    if "Exchange" in ast.unparse(sub.annotation) or opens(sub.value):
                        known = known | {sub.target.id}
                elif isinstance(sub, ast.Assign) and opens(sub.value):
                    known = known | {t.id for t in sub.targets if isinstance(t, ast.Name)}

        def is_exchange(obj: ast.expr) -> bool:
            name = last_name(obj)
            if name is None:
                return False
            if isinstance(obj, ast.Name) and name in known:
                return True
            return "exchange" in name.lower()

        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"setattr", "delattr"}
            and len(node.args) >= 2
        ):
            obj, attr = node.args[0], node.args[1]
            if is_exchange(obj) and not (
                isinstance(attr, ast.Constant) and attr.value not in slots
            ):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List):
                targets.extend(target.elts)
            elif isinstance(target, ast.Starred):
                targets.append(target.value)
            elif (
                isinstance(target, ast.Attribute)
                and target.attr in slots
                and is_exchange(target.value)
            ):
                found.append(f"{where}:{target.lineno}: {ast.unparse(target)}")
        for child in ast.iter_child_nodes(node):
            visit(child, known, own)

    visit(tree, frozenset(), False)
    return found


def test_only_the_exchange_writes_its_state() -> None:
    # The exchange is the state machine of one request, as h11's Connection is of one
    # connection: protocols return what they parsed, the app returns its verdict on the
    # head, and the exchange applies both. No module but its own assigns its fields.
    from batchserve.server.exchange import Exchange

    slots = frozenset(Exchange.__slots__)
    assert {"model", "request", "deadline", "tenant", "work_class", "respond"} <= slots
    own = SRC / "server" / "exchange.py"
    root = SRC.parent.parent
    files = [f for f in sorted(SRC.rglob("*.py")) if f != own]
    # The peers' virtualenvs (bench/.venvs, made by bench/peers/setup.py) are not ours.
    files += sorted(f for f in (root / "bench").rglob("*.py") if ".venvs" not in f.parts)
    assert len(files) > 90
    writes = [
        w
        for f in files
        for w in _exchange_writes(f.read_text(encoding="utf-8"), str(f.relative_to(root)), slots)
    ]
    assert not writes, "an exchange's fields written outside server/exchange.py:\n" + "\n".join(
        writes
    )
    # The rule sees what it is meant to see: each way of writing one is caught.
    cases = [
        "def f(exchange):\n    exchange.model = 1\n",
        "def f(self):\n    self._exchange.deadline -= 1\n",
        "def f(x: 'Exchange'):\n    x.tenant = 't'\n",
        "def f(app):\n    e = app.begin(1, 2, 3, 4, None)\n    e.respond, y = None, 2\n",
        "class T(Exchange):\n    def g(self):\n        self.work_class = None\n",
        "def f(exchange):\n    setattr(exchange, 'request', 1)\n",
        "def f(exchange):\n    del exchange.reply\n",
    ]
    for case in cases:
        assert len(_exchange_writes(case, "case", slots)) == 1, case
    fine = "def f(exchange, model):\n    model.request = exchange.request\n    model.x = 1\n"
    assert _exchange_writes(fine, "case", slots) == []
