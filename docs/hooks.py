"""The manual's generated parts, rendered by mkdocs as it builds (``hooks:`` in mkdocs.yml).

A page asks for a generated block with an HTML comment on a line of its own; the comment is
replaced before the page's Markdown is rendered:

- ``<!-- results: NAME -->``: the table of ``docs/results/NAME.json``, a file written from a
  bench command's ``--json`` output by ``bench/tools/record.py``, with a caption naming
  the command, the machine and the date (the format: docs/benchmarks/index.md). Benchmark
  pages hold no hand-typed figures.
- ``<!-- statuses -->``: the one table from reason to HTTP status and gRPC code, from
  ``batchserve.server.statuses`` (``STATUS_TABLE`` and ``GRPC_TABLE``), so it cannot drift.
- ``<!-- cli: COMMAND -->``: the flags of ``batchserve COMMAND``, from the real parser.

The same function renders a results block in the README, which a test compares with it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"

# The manual documents the working tree it is built from, not an installed copy.
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

# The widest code line that a page shows whole at 1280 px (a test holds the pages to it).
CODE_COLUMNS = 80
MARKER = re.compile(r"^<!-- (results|statuses|cli)(?:: *([\w-]+))? -->$", re.M)
# Docstrings cross-reference in Sphinx's roles; mkdocstrings renders them literally.
SPHINX_ROLE = re.compile(r":(?:class|func|meth|data|mod|attr|exc|obj):<code>(~?)([\w.]+)</code>")


def load_results(name: str) -> dict[str, Any]:
    """The result file ``docs/results/NAME.json``, checked for the keys every one must have.

    Raises:
        ValueError: a key is missing or a column names no figure of any row.
    """
    data: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())
    for key in ("title", "command", "machine", "date", "columns", "rows"):
        if key not in data:
            raise ValueError(f"docs/results/{name}.json has no {key!r}")
    for key, _, _ in data["columns"]:
        # A row may lack a figure (a scenario that measures other things): an empty cell.
        if not any(key in row for row in data["rows"]):
            raise ValueError(f"docs/results/{name}.json: no row has {key!r}")
    return data


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return format(value, fmt) if fmt else str(value)


def render_results(name: str, results_url: str = "docs/results") -> str:
    """The Markdown table of one result file, its caption naming where the figures came from.

    Args:
        name: the file's name in ``docs/results`` without ``.json``.
        results_url: where the caption's link finds that folder from the page.
    """
    data = load_results(name)
    columns: list[list[str]] = data["columns"]
    head = "| " + " | ".join(title for _, title, _ in columns) + " |"
    align = "|" + "|".join("---" if not fmt else "---:" for _, _, fmt in columns) + "|"
    body = [
        "| " + " | ".join(_cell(row.get(key), fmt) for key, _, fmt in columns) + " |"
        for row in data["rows"]
    ]
    caption = f"*{data['title']}.* `{data['command']}` on {data['machine']}, {data['date']}."
    caption += f" Figures: [`{name}.json`]({results_url}/{name}.json)."
    return "\n".join([head, align, *body, "", caption])


def render_statuses() -> str:
    """The table from reason to HTTP status and gRPC code, in the code's order."""
    from batchserve.server.statuses import GRPC_TABLE, RETRY_REASONS, STATUS_TABLE

    lines = [
        "| reason | HTTP | gRPC | when |",
        "|---|---:|---|---|",
    ]
    for reason, (status, when) in STATUS_TABLE.items():
        retry = " (with `Retry-After`)" if reason in RETRY_REASONS else ""
        lines.append(f"| `{reason}` | {status} | `{GRPC_TABLE[reason]}` | {when}{retry} |")
    return "\n".join(lines)


def render_cli(command: str) -> str:
    """The flags of ``batchserve COMMAND`` as a table, from the real parser.

    One row per flag: its names, the value it takes, and its help with defaults expanded as
    ``--help`` prints them. A table wraps where ``--help``'s fixed columns would not.
    """
    from batchserve.cli import build_parser

    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub: argparse.ArgumentParser = actions[0].choices[command]
    formatter = sub._get_formatter()
    lines = ["| flag | value | what it does |", "|---|---|---|"]
    for action in sub._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flags = ", ".join(f"`{flag}`" for flag in action.option_strings)
        value = ""
        if action.nargs != 0:
            value = formatter._format_args(action, action.dest.upper())
        what = " ".join(formatter._expand_help(action).split()) if action.help else ""
        # A long value (``--class``'s) may break after its commas, not only at spaces.
        cells = [flags, _escape(value).replace(",", ",<wbr>"), _escape(what)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _escape(text: str) -> str:
    """Text safe in a Markdown table cell: pipes, brackets and stars taken literally."""
    for char in "\\|[]*_<":
        text = text.replace(char, "\\" + char)
    return text


def render_markers(markdown: str, results_url: str = "results") -> str:
    """``markdown`` with every marker replaced by its block."""

    def replace(match: re.Match[str]) -> str:
        kind, arg = match.group(1), match.group(2)
        if kind == "statuses":
            return render_statuses()
        if arg is None:
            raise ValueError(f"marker {match.group(0)} needs a name")
        if kind == "cli":
            return render_cli(arg)
        return render_results(arg, results_url)

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """mkdocs: render the markers of one page before its Markdown is converted."""
    depth = page.file.src_uri.count("/")
    return render_markers(markdown, results_url="../" * depth + "results")


def on_page_content(html: str, **_: Any) -> str:
    """mkdocs: drop the reST that docstrings carry: roles before inline code, ``::``.

    ``:class:`~a.b.C``` reads ``C``, as Sphinx shows it; ``:class:`a.b.C``` stays whole.
    """

    def plain(match: re.Match[str]) -> str:
        name = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
        return f"<code>{name}</code>"

    # reST's "Example::" introduces a literal block; the block renders, the "::" need not.
    return SPHINX_ROLE.sub(plain, html).replace("::</p>", ":</p>")
