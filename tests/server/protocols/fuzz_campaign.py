"""A fuzzing campaign: the KServe decoders fuzzed at length (atheris / libFuzzer).

Runs each target of ``fuzz_kserve.py``, beside it (the gRPC ModelInfer decoding
into an exchange's items; the HTTP KServe body with Triton's binary tensor extension) for
``--seconds`` from its seed corpus, keeping the corpus under ``--corpus`` so a later run
goes on from where this one stopped. Prints, per target, the inputs executed, the coverage
libFuzzer reached and any crash (its input is written under ``--corpus``/artifacts). The
suite runs the same targets for a few seconds (``test_fuzz.py``).

Run: ``.venv/bin/python tests/server/protocols/fuzz_campaign.py [--seconds 60]
[--corpus /tmp/batchserve-fuzz]``
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent / "fuzz_kserve.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--corpus", default="/tmp/batchserve-fuzz", help="kept between runs")
    parser.add_argument("--targets", default="grpc,http")
    args = parser.parse_args()
    failed = 0
    for target in args.targets.split(","):
        base = pathlib.Path(args.corpus) / target
        artifacts = base / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                str(SCRIPT),
                target,
                str(base / "corpus"),
                f"-max_total_time={args.seconds}",
                "-timeout=10",
                "-rss_limit_mb=2048",
                f"-artifact_prefix={artifacts}/",
                "-print_final_stats=1",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        stats = dict(re.findall(r"stat::(\w+):\s+(\d+)", proc.stderr))
        cov = re.findall(r"cov: (\d+) ft: (\d+)", proc.stderr)
        crashes = sorted(p.name for p in artifacts.iterdir())
        print(
            f"{target}: {stats.get('number_of_executed_units', '?')} inputs in "
            f"{args.seconds} s, coverage {cov[-1][0] if cov else '?'} edges / "
            f"{cov[-1][1] if cov else '?'} features, corpus "
            f"{len(list((base / 'corpus').iterdir()))} inputs, exit {proc.returncode}, "
            f"artifacts {crashes or 'none'}"
        )
        if proc.returncode != 0:
            failed += 1
            print(proc.stderr[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
