"""The outside programs tests and benchmarks drive, found where the set-up put them.

Nothing here installs anything: ``scripts/install-tools`` does (``scripts/test`` runs it
before the suite). A test that needs a program never skips without it: each ``find_*``
returns the program's path or raises :class:`MissingTool`, whose message names the command
that installs it, so the test fails and says how to make it pass.

* Debian's programs (nginx, Chromium, Prometheus and its ``promtool``, curl, ``h2load``) are
  looked for on the PATH and in the ``sbin`` folders, where a non-root PATH may not reach.
* Triton's ``perf_analyzer`` has no working Debian or PyPI package for this machine: the
  set-up unpacks it from the ``tritonclient`` 2.50.0 wheel, with the CUDA runtime it loads
  at start, under ``perf_analyzer`` in the virtual environment (``sys.prefix``), and it
  runs with that folder's ``lib`` on its library path.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

#: The set-up command that installs every program the suite needs (``scripts/test`` runs it).
SETUP = "scripts/install-tools"
#: Where the set-up unpacks perf_analyzer: in the virtual environment (``sys.prefix``).
PERF_ANALYZER_HOME = pathlib.Path(sys.prefix) / "perf_analyzer"
_SBIN = "/usr/sbin:/sbin:/usr/bin:/bin"


class MissingTool(RuntimeError):
    """An outside program is not installed; the message names the command that installs it."""

    def __init__(self, tool: str, what: str) -> None:
        super().__init__(
            f"{what} is not installed: run `{SETUP} {tool}` from the repository root "
            f"(`scripts/test` runs `{SETUP}` before the suite)"
        )
        self.tool = tool


def find_binary(binary: str, *, tool: str | None = None) -> str:
    """The path of Debian's ``binary``.

    Args:
        binary: the program's file name.
        tool: the name ``scripts/install-tools`` knows it by (default: ``binary``).

    Raises:
        MissingTool: it is neither on the PATH nor in ``/usr/sbin`` or ``/sbin``.
    """
    path = shutil.which(binary) or shutil.which(binary, path=_SBIN)
    if path is None:
        raise MissingTool(tool or binary, binary)
    return path


def find_nginx() -> str:
    """Debian's nginx (the ``nginx-light`` package)."""
    return find_binary("nginx")


def find_chromium() -> str:
    """Debian's headless-capable Chromium."""
    return find_binary("chromium")


def find_promtool() -> str:
    """Prometheus's ``promtool`` (Debian's ``prometheus`` package ships both)."""
    return find_binary("promtool", tool="prometheus")


def find_prometheus() -> str:
    """The Prometheus server binary."""
    return find_binary("prometheus")


def find_curl() -> str:
    """curl, which the README's first request uses."""
    return find_binary("curl")


def find_h2load() -> str:
    """nghttp2's ``h2load`` (only the gRPC benchmark needs it, not the suite)."""
    return find_binary("h2load")


def find_perf_analyzer() -> tuple[str, dict[str, str]]:
    """Triton's ``perf_analyzer``: its path and the environment it runs in.

    Raises:
        MissingTool: the binary, its CUDA runtime or Debian's ``libb64`` is not installed.
    """
    binary = PERF_ANALYZER_HOME / "bin" / "perf_analyzer"
    libdir = PERF_ANALYZER_HOME / "lib"
    libb64 = ("/usr/lib/x86_64-linux-gnu", "/usr/lib", "/lib/x86_64-linux-gnu")
    ready = (
        binary.exists()
        and (libdir / "libcudart.so.12").exists()
        and any((pathlib.Path(d) / "libb64.so.0d").exists() for d in libb64)
    )
    if not ready:
        raise MissingTool("perf_analyzer", f"perf_analyzer (under {PERF_ANALYZER_HOME})")
    return str(binary), {**os.environ, "LD_LIBRARY_PATH": str(libdir)}
