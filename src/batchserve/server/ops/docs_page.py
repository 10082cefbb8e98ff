"""The ``/docs`` page: plain HTML rendered from the OpenAPI spec.

No script and nothing fetched from elsewhere (the server may run where nothing outside can
be reached): each endpoint with its parameters and responses, the table of outcomes and
status codes, and the schemas (:mod:`batchserve.server.ops.openapi` writes the spec).
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from batchserve.server.statuses import STATUS_TABLE

__all__ = ["docs_html"]

_INLINE_CODE = re.compile(r"`([^`]+)`")


def _text(text: str) -> str:
    # A description's text, escaped, with its `inline code` set as code (the descriptions
    # are written in the markdown that OpenAPI's own viewers render).
    return _INLINE_CODE.sub(r"<code>\1</code>", html.escape(text))


def docs_html(spec: dict[str, Any]) -> str:
    """A self-contained HTML page describing ``spec`` (no scripts, no external assets)."""
    e = _text
    rows = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            params = "".join(
                f"<li><code>{e(p['name'])}</code> ({e(p['in'])}): "
                f"{e(p.get('description', ''))}</li>"
                for p in op.get("parameters", [])
            )
            responses = "".join(
                f"<li><b>{e(code)}</b> {e(r.get('description', ''))}</li>"
                for code, r in op.get("responses", {}).items()
            )
            rows.append(
                f"<section><h3><code>{method.upper()} {e(path)}</code> {e(op['summary'])}</h3>"
                f"<p>{e(op.get('description', ''))}</p>"
                + (f"<p>Parameters:</p><ul>{params}</ul>" if params else "")
                + f"<p>Responses:</p><ul>{responses}</ul></section>"
            )
    table = "".join(
        f"<tr><td><code>{e(r)}</code></td><td>{s}</td><td>{e(d)}</td></tr>"
        for r, (s, d) in STATUS_TABLE.items()
    )
    info = spec["info"]
    schemas = e(json.dumps(spec["components"]["schemas"], indent=2))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>batchserve API</title>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto;padding:1em;"
        "overflow-wrap:anywhere}section{border-top:1px solid #ccc}"
        "code{background:#f4f4f4;overflow-wrap:anywhere}"
        "pre{white-space:pre-wrap;overflow-x:auto;background:#f8f8f8;padding:.5em}"
        "table{border-collapse:collapse;width:100%}"
        "td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}"
        "</style></head><body>"
        f"<h1>{e(info['title'])} {e(info['version'])}</h1><p>{e(info['description'])}</p>"
        "<p>Machine-readable: <a href='/openapi.json'>/openapi.json</a>.</p>"
        "<h2>Outcomes and status codes</h2><table><tr><th>X-Reason</th><th>status</th>"
        f"<th>when</th></tr>{table}</table><h2>Endpoints</h2>{''.join(rows)}"
        f"<h2>Schemas</h2><pre>{schemas}</pre></body></html>"
    )
