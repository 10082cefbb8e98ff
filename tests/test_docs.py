"""The manual is checked like code.

It builds strictly (no broken link, no missing page, every API object resolved), once per
run. Every ``batchserve ...`` command line in its shell blocks and in the README's parses
with the real CLI parser (a ``serve`` line's values build its settings too); every
``python bench/X.py`` names a file that exists and flags it defines; every ``scripts/X`` is
executable. Tables of figures come from result files (a
benchmark page holds none typed by hand), and the table of statuses from the code's one
table. In the browser tier, the built pages read at 1280 px without scrolling sideways.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import importlib.util
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import ModuleType

import pytest

from batchserve.cli import build_parser
from batchserve.cli.serve import build_settings
from batchserve.server.statuses import GRPC_TABLE, STATUS_TABLE
from browser import open_browser

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ARTIFACTS = pathlib.Path(os.environ.get("BATCHSERVE_ARTIFACTS", ROOT / "artifacts"))
PAGES = sorted(DOCS.rglob("*.md"))
SHELL_BLOCK = re.compile(r"^```(?:sh|bash|console|shell)\n(.*?)^```", re.M | re.S)


def load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The manual, built once with ``mkdocs build --strict``."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def shell_commands(text: str) -> Iterator[list[str]]:
    """Each simple command of each shell block: continuations joined, comments dropped."""
    for block in SHELL_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            command: list[str] = []
            for token in [*lexer, ";"]:
                if token and set(token) <= set("|&;<>"):
                    if command:
                        yield command
                    command = []
                    if ">" in token or "<" in token:
                        command = ["<redirect>"]  # the file name that follows is no command
                else:
                    command.append(token)


def documented_commands() -> list[tuple[str, list[str]]]:
    sources = [*PAGES, ROOT / "README.md"]
    found = []
    for path in sources:
        for command in shell_commands(path.read_text()):
            while command and re.fullmatch(r"[A-Z_]+=\S*", command[0]):
                command = command[1:]  # VAR=value in front of a command
            if command and command[0] != "<redirect>":
                found.append((str(path.relative_to(ROOT)), command))
    return found


COMMANDS = documented_commands()


def test_the_docs_show_commands_of_every_kind() -> None:
    programs = {c[0] for _, c in COMMANDS}
    assert {"batchserve", "python", "scripts/serve", "scripts/test", "curl"} <= programs
    assert sum(c[0] == "batchserve" for _, c in COMMANDS) >= 25


@pytest.mark.parametrize(
    ("where", "argv"),
    [(w, c) for w, c in COMMANDS if c[0] == "batchserve"],
    ids=lambda v: v if isinstance(v, str) else " ".join(v[:2]),
)
def test_every_batchserve_command_parses(where: str, argv: list[str]) -> None:
    parser = build_parser()
    parser.exit_on_error = False
    try:
        args = parser.parse_args(argv[1:])
    except (SystemExit, argparse.ArgumentError) as exc:
        pytest.fail(f"{where}: {shlex.join(argv)} does not parse: {exc}")
    assert callable(args.run)
    if argv[1] == "serve" and args.config is None:  # the values too, as serve reads them
        build_settings(args, environ={})


def test_the_getting_started_example_prints_what_it_says() -> None:
    page = (DOCS / "getting-started.md").read_text()
    code = re.search(r"## Batch in Python.*?```python\n(.*?)```", page, re.S)
    assert code is not None
    out = subprocess.run(
        [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    printed = out.stdout.strip()
    assert printed == "[[1.0], [2.0], [3.0]] {3: 1}"
    assert f"It prints `{printed}`" in page


def test_every_bench_and_script_named_in_a_command_exists() -> None:
    for where, argv in COMMANDS:
        if argv[0].endswith("python"):
            script = ROOT / argv[1]
            assert script.is_file(), f"{where}: {shlex.join(argv)}: no {argv[1]}"
            source = script.read_text()
            # A script's flags may be its package's (bench/peers/compare.py: comparison/).
            for package in script.parent.glob("*/__init__.py"):
                if f"from {package.parent.name}." in source:
                    source += "".join(p.read_text() for p in package.parent.glob("*.py"))
            for flag in (a.split("=")[0] for a in argv[2:] if a.startswith("--")):
                assert f'"{flag}"' in source, f"{where}: {argv[1]} defines no {flag}"
        elif argv[0].startswith("scripts/"):
            assert os.access(ROOT / argv[0], os.X_OK), f"{where}: {argv[0]} is not executable"


def test_every_bench_named_in_the_prose_exists() -> None:
    for path in [*PAGES, ROOT / "README.md"]:
        for name in re.findall(r"\b(bench/[\w/]+\.py)\b", path.read_text()):
            assert (ROOT / name).is_file(), f"{path.relative_to(ROOT)} names {name}"


def test_code_blocks_fit_the_page_without_scrolling() -> None:
    for path in PAGES:
        for block in re.findall(r"^```\w*\n(.*?)^```", path.read_text(), re.M | re.S):
            for line in block.splitlines():
                assert len(line) <= hooks.CODE_COLUMNS, f"{path.relative_to(ROOT)}: {line}"


def test_result_files_say_where_their_figures_came_from() -> None:
    files = sorted((DOCS / "results").glob("*.json"))
    assert files
    for path in files:
        data = hooks.load_results(path.stem)
        assert data["rows"], path.name
        assert re.match(r"(batchserve|python|\.venv/bin/python|for) ", data["command"]), path.name
        # Written by the run that measured them: none copied from an older record.
        assert "transcribed" not in data, f"{path.name}: figures transcribed, not measured"
        for command in shell_commands(f"```sh\n{data['command']}\n```\n"):
            scripts = [a for a in command if re.fullmatch(r"bench/[\w/]+\.py", a)]
            for script in scripts:  # the script that wrote it is still there, with its flags
                source = (ROOT / script).read_text() if (ROOT / script).is_file() else ""
                assert source, f"{path.name}: no {script}"
                for flag in (a.split("=")[0] for a in command if a.startswith("--")):
                    assert f'"{flag}"' in source, f"{path.name}: {script} defines no {flag}"
        used = [p for p in PAGES if f"<!-- results: {path.stem} -->" in p.read_text()]
        assert used, f"{path.name} is rendered by no page"


def test_benchmark_pages_hold_no_hand_typed_figures() -> None:
    for path in sorted((DOCS / "benchmarks").glob("*.md")):
        for line in path.read_text().splitlines():
            if line.startswith("|"):
                assert not re.search(r"\d", line), f"{path.name}: a hand-typed table row: {line}"


def test_the_readmes_results_blocks_are_rendered_from_their_files() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(
        r"^<!-- results: ([\w-]+) -->\n(.*?)\n<!-- end results -->$", readme, re.M | re.S
    )
    assert len(blocks) == readme.count("<!-- results:"), "a results block without its end"
    for name, block in blocks:
        assert block == hooks.render_results(name, "docs/results"), name


def test_the_status_table_is_rendered_from_the_code(site: pathlib.Path) -> None:
    source = (DOCS / "serving" / "statuses.md").read_text()
    assert "<!-- statuses -->" in source
    assert not re.search(r"^\|.*\b(429|RESOURCE_EXHAUSTED)\b", source, re.M)
    html = (site / "serving" / "statuses" / "index.html").read_text()
    rows = re.findall(
        r"<tr>\s*<td><code>(\w+)</code></td>\s*<td[^>]*>(\d+)</td>\s*<td><code>(\w+)</code>", html
    )
    assert rows == [(r, str(status), GRPC_TABLE[r]) for r, (status, _) in STATUS_TABLE.items()]


def test_the_site_has_every_page_and_the_api(site: pathlib.Path) -> None:
    for page in PAGES:
        rel = page.relative_to(DOCS).with_suffix("")
        built = site / ("index.html" if rel.name == "index" else rel / "index.html")
        if rel.name == "index" and rel.parent != pathlib.Path("."):
            built = site / rel.parent / "index.html"
        assert built.is_file(), f"{page} was not built"
    api = (site / "reference" / "core" / "index.html").read_text()
    for name in ("batchserve.Batcher", "batchserve.BatchConfig", "batchserve.errors.QueueFull"):
        assert f'id="{name}"' in api, name
    assert ":class:" not in api
    assert "<code>~" not in api
    search = json.loads((site / "search" / "search_index.json").read_text())
    assert len(search["docs"]) > 100


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the built site as a reader gets it (search runs in a web worker), unlogged."""

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.slow
def test_the_manual_reads_at_1280_px_without_scrolling_sideways(site: pathlib.Path) -> None:
    pages = {
        "front": "index.html",
        "concepts": "concepts/index.html",
        "statuses": "serving/statuses/index.html",
        "flags": "serving/configuration/index.html",
        "benchmarks": "benchmarks/peers/index.html",
        "seed-demo": "benchmarks/server/index.html",
        "fleets": "benchmarks/fleets/index.html",
        "api": "reference/core/index.html",
        "api-more": "reference/more/index.html",
    }
    handler = functools.partial(QuietHandler, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            shots = look_at(f"http://127.0.0.1:{server.server_address[1]}/", pages)
        finally:
            server.shutdown()
    assert shots == set(pages)


def look_at(url: str, pages: dict[str, str]) -> set[str]:
    """Open each page at 1280 px, check it, and save a screenshot of its top."""
    seen = set()
    with open_browser() as page:
        for name, rel in pages.items():
            page.goto(url + rel)
            widths = page.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            )
            nav = page.evaluate("document.querySelectorAll('.md-nav--primary a').length")
            # Tables and code blocks read whole: none scrolls inside its own frame either.
            cut = page.evaluate(
                "[...document.querySelectorAll('.md-typeset__scrollwrap, pre > code')]"
                ".filter(e => e.scrollWidth > e.clientWidth + 1)"
                ".map(e => e.innerText.slice(0, 60))"
            )
            page.screenshot(ARTIFACTS / f"manual-{name}.png", max_height=2400)
            assert widths[0] <= widths[1], (name, widths)
            assert nav >= 20, (name, nav)
            assert cut == [], (name, cut)
            seen.add(name)
        assert page.errors == [], page.errors
    return seen
