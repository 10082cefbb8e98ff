"""Coverage-guided fuzzing of the KServe decoders, a few seconds per target (atheris).

Each target of ``fuzz_kserve.py`` runs in a subprocess (libFuzzer ends its process) for
:data:`SECONDS` from its seed corpus; a crash (an exception other than a client's refusal)
fails the test with libFuzzer's report and the input it wrote. ``fuzz_campaign.py`` runs
the same targets for longer. Regressions found this way are tests of their own in
``test_kserve_grpc.py`` and ``test_kserve.py``.
"""

from __future__ import annotations

import pathlib
import resource
import subprocess
import sys

import pytest

pytest.importorskip("atheris")

pytestmark = pytest.mark.slow

HERE = pathlib.Path(__file__).resolve().parent
#: Seconds of fuzzing per target in the suite.
SECONDS = 4


#: The fuzzing process's address space (Python, atheris and protobuf take about 1 GiB).
ADDRESS_SPACE = 4 << 30


def _bound_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.mark.parametrize("target", ["grpc", "http"])
def test_the_decoder_refuses_or_accepts_never_crashes(target: str, tmp_path: pathlib.Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "fuzz_kserve.py"),
            target,
            str(tmp_path / "corpus"),
            f"-max_total_time={SECONDS}",
            "-seed=1",
            "-timeout=10",
            # libFuzzer's own bound reads the peak RSS, which Linux carries over fork and
            # exec from this (large) test process: it would stop at once. The address
            # space is bounded instead, so a decoder that allocates gigabytes on a hostile
            # input raises MemoryError, a crash.
            "-rss_limit_mb=0",
            f"-artifact_prefix={tmp_path}/",
        ],
        preexec_fn=_bound_memory,
        capture_output=True,
        text=True,
        timeout=SECONDS + 60,
    )
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-"))]
    assert not crashes, proc.stderr[-4000:]
    assert proc.returncode == 0, proc.stderr[-4000:]
    # It ran: libFuzzer's final line counts the inputs it executed.
    assert "Done" in proc.stderr, proc.stderr[-2000:]


def test_the_campaign_script_starts_as_its_docstring_runs_it() -> None:
    done = subprocess.run(
        [sys.executable, str(HERE / "fuzz_campaign.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--seconds" in done.stdout
