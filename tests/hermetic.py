"""The suite's own home (a plugin, ``-p hermetic``): no test reads or writes the user's.

A test's verdict must not depend on what the user did before: a user who served once has
an ``auto`` verdict and exports in ``~/.cache/batchserve``, and a test that read them would
load another engine than it expects. So, before anything is imported or collected:

* ``HOME`` and the XDG folders (cache, config, data, state) point into a fresh folder for
  the run, so no library (Hugging Face, torch, OpenVINO, matplotlib, Chromium) reads or
  writes the user's; it is removed at the end;
* the variables that point batchserve elsewhere (``BATCHSERVE_CACHE_DIR``,
  ``BATCHSERVE_QUALITY_SET``) are dropped: the suite sets them where it wants them;
* every test gets a batchserve cache of its own (``BATCHSERVE_CACHE_DIR``, empty); the
  tests that need exports and gate figures share the run's one cache,
  ``engine_cache`` (``engine_fixtures``), so nothing is exported twice;
* the user's batchserve cache is listed (names, sizes, times) before the run and after it,
  and a run that changed it fails, naming what changed.

``tests/test_hermetic.py`` proves it: the suite's tests pass with a user cache whose
``auto`` verdict names another engine, and leave that cache as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

#: Variables that would point a test at the user's files or settings.
DROPPED = ("BATCHSERVE_CACHE_DIR", "BATCHSERVE_QUALITY_SET", "HF_HOME", "TORCH_HOME")
#: Where the XDG variables point, under the run's home.
XDG = {
    "XDG_CACHE_HOME": ".cache",
    "XDG_CONFIG_HOME": ".config",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
}
Listing = dict[str, tuple[int, int]]

_saved: dict[str, str | None] = {}
_run_home: Path | None = None
_user_cache: Path | None = None
_before: Listing | None = None


def user_cache_dir(environ: dict[str, str] | os._Environ[str]) -> Path:
    """The batchserve cache the user's environment names (as ``default_cache_dir`` reads it)."""
    if environ.get("BATCHSERVE_CACHE_DIR"):
        return Path(environ["BATCHSERVE_CACHE_DIR"])
    home = environ.get("HOME") or os.path.expanduser("~")
    return Path(environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")) / "batchserve"


def listing(root: Path) -> Listing:
    """Every file and folder under ``root``: relative path -> (size, mtime in ns)."""
    out: Listing = {}
    if not root.exists():
        return out
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_size if name in files else 0, st.st_mtime_ns)
    return out


def changes(before: Listing, after: Listing) -> list[str]:
    """What differs between two listings, one line each (empty when nothing does)."""
    lines = [f"added {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    lines += [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return lines


def enter_run_home() -> None:
    """Move the run into a home of its own (done once, when pytest loads this plugin)."""
    global _run_home, _user_cache, _before
    if _run_home is not None:
        return
    _user_cache = user_cache_dir(os.environ)
    _before = listing(_user_cache)
    _run_home = Path(tempfile.mkdtemp(prefix="batchserve-tests-home-"))
    for key in ("HOME", *XDG, *DROPPED):
        _saved[key] = os.environ.get(key)
    for key in DROPPED:
        os.environ.pop(key, None)
    os.environ["HOME"] = str(_run_home)
    for key, sub in XDG.items():
        os.environ[key] = str(_run_home / sub)


# At import: ``-p hermetic`` comes first in addopts, so this runs before the other plugins
# and any test module are imported (a library may read HOME when it is imported).
enter_run_home()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if the user's batchserve cache changed under it."""
    if _user_cache is None or _before is None:
        return
    changed = changes(_before, listing(_user_cache))
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the suite changed the user's cache {_user_cache}:\n  " + "\n  ".join(
            changed[:20]
        )
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give the user's environment back and remove the run's home."""
    global _run_home
    if _run_home is None:
        return
    for key, value in _saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    shutil.rmtree(_run_home, ignore_errors=True)
    _run_home = None


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's batchserve cache: empty, its own (``BATCHSERVE_CACHE_DIR``)."""
    path = tmp_path_factory.mktemp("cache", numbered=True)
    monkeypatch.setenv("BATCHSERVE_CACHE_DIR", str(path))
    return path
