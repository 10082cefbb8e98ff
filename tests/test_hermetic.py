"""The suite is hermetic: the user's caches, home and settings neither change it nor are changed.

The proof runs a slice of the suite as a user who served before would: a home whose
batchserve cache holds an ``auto`` verdict that names ONNX Runtime, and that engine's
export. Outside the suite that cache changes what ``load_model("minilm")`` does (it loads
ONNX Runtime, and needs no sentence-transformers: checked first, so the proof cannot pass
by accident); inside (a pytest of a slice of the suite in that home), the tests pass as on
a clean machine, and the home is left as found.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchserve.engines.loader import load_model
from batchserve.engines.runtime import default_cache_dir
from hermetic import changes, listing, user_cache_dir

ROOT = Path(__file__).resolve().parent.parent
#: The test of issue 34 that read the user's verdict, and a few that read the environment.
SLICE = [
    "tests/engines/test_embeddings.py::test_without_the_extra_one_sentence_names_the_pip_command",
    "tests/test_hermetic.py::test_each_test_has_a_cache_and_the_run_a_home_of_its_own",
    "tests/engines/test_runtime.py",
]


def test_listing_says_what_changed(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "verdict.json").write_text("{}")
    before = listing(tmp_path)
    assert changes(before, listing(tmp_path)) == []
    (tmp_path / "a" / "verdict.json").write_text("{} ")
    (tmp_path / "b.json").write_text("")
    assert changes(before, listing(tmp_path)) == ["added b.json", "changed a/verdict.json"]
    assert listing(tmp_path / "missing") == {}


def test_each_test_has_a_cache_and_the_run_a_home_of_its_own(own_cache: Path) -> None:
    assert default_cache_dir() == own_cache
    assert not own_cache.exists() or not any(own_cache.iterdir())
    home = Path(os.environ["HOME"])
    assert home.name.startswith("batchserve-tests-home-")
    assert Path.home() == home
    assert Path(os.environ["XDG_CACHE_HOME"]).is_relative_to(home)
    assert "BATCHSERVE_QUALITY_SET" not in os.environ
    assert user_cache_dir(os.environ) == own_cache


class Fake:
    """An engine whose pass costs ``per_item_s`` per text (a sleep)."""

    def __init__(self, per_item_s: float) -> None:
        self.per_item_s = per_item_s

    def __call__(self, texts: Sequence[str]) -> Any:
        time.sleep(self.per_item_s * len(texts))
        return np.ones((len(texts), 384), dtype=np.float32)


def served_before(home: Path, engine_cache: Path) -> Path:
    """A home whose batchserve cache says ``auto`` chose ONNX Runtime, with its export.

    The verdict is written by ``choose`` itself, as ``load_model("minilm")`` would key it
    on this machine, from fake engines (ONNX Runtime the fastest) and a gate record that
    passes; the export is a copy of the run's (made once, in ``engine_cache``).
    """
    from batchserve.engines.choice import choose
    from batchserve.engines.edges import Edges
    from batchserve.engines.embeddings import builtin_path
    from batchserve.engines.export import ensure_exported, model_folder
    from batchserve.engines.gate import default_quality_set, set_digest
    from batchserve.engines.hardware import Engine, Machine
    from batchserve.engines.quality import Quality
    from batchserve.engines.runtime import default_threads, default_workers, resolve_device

    cache = home / ".cache" / "batchserve"
    source = builtin_path()
    onnx = ensure_exported(source, "onnx", engine_cache)
    folder = model_folder(source, cache)
    shutil.copytree(onnx.folder, folder / onnx.folder.name)
    qs = default_quality_set({})
    # both engines' gate records pass, the edge texts included (the fakes are no model)
    edges = Edges(
        texts=20, min_cosine=1.0, worst="x", norm_error=0.0, floor=0.9999, norm_bound=1e-3
    )
    good = Quality(
        texts=10, mean_cosine=1.0, min_cosine=0.99999, queries=4, ranking_agreement=1, edges=edges
    )
    (folder / "gate").mkdir()
    for name in ("onnx-float32", "torch-float32"):
        (folder / "gate" / f"{name}-{set_digest(qs)}.json").write_text(json.dumps(good.to_dict()))
    machine = Machine.here()
    device = resolve_device("auto", cuda_devices=len(machine.cuda_devices), mps=machine.mps)
    threads = default_threads()
    fakes = {Engine("torch", "float32"): Fake(0.002), Engine("onnx", "float32"): Fake(0.0002)}
    verdict, _ = choose(
        source,
        device=device,
        threads=threads,
        workers=default_workers(device, threads),
        batch_size=32,
        cache_dir=cache,
        load=lambda engine: fakes[engine],
        machine=machine,
        installed={"torch", "onnx"},
        quality_set=qs,
        rounds=1,
        repeats=1,
    )
    assert verdict.chosen == Engine("onnx", "float32")
    return cache


@pytest.mark.slow
def test_the_suite_passes_beside_a_user_cache_that_names_another_engine(
    engine_cache: Path, tmp_path: Path
) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("onnxruntime")
    home = tmp_path / "home"
    served_before(home, engine_cache)
    user = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "BATCHSERVE_"))}
    user["HOME"] = str(home)

    # Outside the suite, this cache decides: with the user's environment (here, in this
    # process), the built-in model loads on ONNX Runtime without sentence-transformers,
    # where the test below expects that load to fail.
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k not in user]:
            mp.delenv(key)
        mp.setenv("HOME", str(home))
        mp.setitem(sys.modules, "sentence_transformers", None)
        engine = load_model("minilm").engine
    assert engine is not None
    assert (engine["backend"], engine["precision"]) == ("onnx", "float32")
    before = listing(home)  # after that load: it may write there, the suite may not

    # Inside, the tests pass as on a clean machine, and leave the cache as they found it.
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *SLICE],
        cwd=ROOT,
        env=user,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    assert changes(before, listing(home)) == []
