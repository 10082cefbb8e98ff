"""``GET /dashboard``: one self-contained HTML page that shows the server live.

The page (``dashboard.html`` beside this module) carries its own CSS and JavaScript and
loads nothing from anywhere: it polls ``status`` (:mod:`batchserve.server.ops.live`, a path
relative to the page, so it also works behind a proxy's prefix) once a second and draws,
per model, requests by outcome with their rates (the difference of two readings), the
queue against its size, queue wait and forward time p50/p99, the batch size distribution,
refusals by reason and the cost model's fit beside the measured passes. Its
``Content-Security-Policy`` lets it reach nothing but its own server.

Every figure it shows carries ``data-field`` (its path in the status document) and
``data-value`` (the number it was drawn from), so a test can read the page as a person sees
it and check it against the server's own figures.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["DASHBOARD_HEADERS", "dashboard_html"]

#: What the page may load: its inline script and style, and its own server's ``status``.
DASHBOARD_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        b"connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
    ),
    (b"cache-control", b"no-cache"),
]


@cache
def dashboard_html() -> bytes:
    """The page's bytes (read once from the package)."""
    return (resources.files("batchserve.server.ops") / "dashboard.html").read_bytes()
