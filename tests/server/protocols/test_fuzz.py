"""Coverage-guided fuzzing of the KServe decoders, a few seconds per target (atheris).

Each target of ``fuzz_kserve.py`` runs in a subprocess (libFuzzer ends its process) for
:data:`SECONDS` from its seed corpus, both at once (a fuzzer's time is wall time, so the
pair costs the suite one target's seconds, and each gets a core when two are free). A
crash (an exception other than a client's refusal) fails the test with libFuzzer's report
and the input it wrote. ``fuzz_campaign.py`` runs the same targets for longer. Regressions
found this way are tests of their own in ``test_kserve_grpc.py`` and ``test_kserve.py``.
"""

from __future__ import annotations

import pathlib
import resource
import subprocess
import sys
from collections.abc import Iterator

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


TARGETS = ("grpc", "http")


@pytest.fixture(scope="module")
def fuzzing(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[subprocess.Popen[bytes], pathlib.Path]]]:
    """Every target's fuzzer, started at once: target -> (process, its folder)."""
    runs: dict[str, tuple[subprocess.Popen[bytes], pathlib.Path]] = {}
    for target in TARGETS:
        out = tmp_path_factory.mktemp(f"fuzz-{target}")
        with open(out / "stderr.txt", "wb") as log:  # a file: no pipe to fill meanwhile
            runs[target] = (
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HERE / "fuzz_kserve.py"),
                        target,
                        str(out / "corpus"),
                        f"-max_total_time={SECONDS}",
                        "-seed=1",
                        "-timeout=10",
                        # libFuzzer's own bound reads the peak RSS, which Linux carries
                        # over fork and exec from this (large) test process: it would stop
                        # at once. The address space is bounded instead, so a decoder that
                        # allocates gigabytes on a hostile input raises MemoryError, a crash.
                        "-rss_limit_mb=0",
                        f"-artifact_prefix={out}/",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    preexec_fn=_bound_memory,
                ),
                out,
            )
    try:
        yield runs
    finally:
        for proc, _ in runs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.parametrize("target", TARGETS)
def test_the_decoder_refuses_or_accepts_never_crashes(
    target: str, fuzzing: dict[str, tuple[subprocess.Popen[bytes], pathlib.Path]]
) -> None:
    proc, out = fuzzing[target]
    code = proc.wait(timeout=SECONDS + 60)
    stderr = (out / "stderr.txt").read_text(errors="replace")
    crashes = [p.name for p in out.iterdir() if p.name.startswith(("crash-", "timeout-"))]
    assert not crashes, stderr[-4000:]
    assert code == 0, stderr[-4000:]
    # It ran: libFuzzer's final line counts the inputs it executed.
    assert "Done" in stderr, stderr[-2000:]


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
