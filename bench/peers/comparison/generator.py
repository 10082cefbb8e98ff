"""The open-loop load of a cell: the project's own generator, ``batchserve load --json``.

A :class:`Load` is one run's offered rate, length and deadline; :func:`drive` runs the
generator once against a server and returns its JSON summary. Every request carries one of
the texts :func:`write_texts` writes (cycled). ``bench/peers/token_batching.py`` drives its
servers with the same function.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comparison.servers import BENCH, MAIN_PYTHON, MODEL_NAME, ROOT, describe, server_env

__all__ = ["TEXTS_FILE", "Load", "drive", "generator_argv", "write_texts"]

#: Every request carries one of these texts (cycled), written to a file for the generator
#: (``--texts``) and read by the ``encode``-alone sweep: 256 texts of 12 common words.
TEXT_COUNT, TEXT_WORDS = 256, 12
TEXTS_FILE = BENCH / "out" / "texts.txt"


def write_texts() -> Path:
    """Write the benchmark's input texts (the project's generator, seed 0) to TEXTS_FILE."""
    from batchserve.loadgen import generate_texts

    TEXTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    TEXTS_FILE.write_text("\n".join(generate_texts(TEXT_COUNT, words=TEXT_WORDS, seed=0)) + "\n")
    return TEXTS_FILE


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """One generator run: offered rate, length, deadline (the caller gives up there too)."""

    rate: float
    duration_s: float
    deadline_ms: float


def generator_argv(
    url: str, load: Load, seed: int, *, texts: Path = TEXTS_FILE, arrivals: str = "constant"
) -> list[str]:
    """The ``batchserve load`` command line of one run (``texts``: one per line, cycled)."""
    return [
        str(MAIN_PYTHON),
        "-m",
        "batchserve",
        "load",
        url,
        "--api",
        "openai",
        "--model",
        MODEL_NAME,
        "--texts",
        str(texts),
        "--arrivals",
        arrivals,
        "--rate",
        f"{load.rate:g}",
        "--duration",
        f"{load.duration_s:g}s",
        "--timeout",
        f"{load.deadline_ms:g}ms",
        "--client-timeout",
        f"{load.deadline_ms:g}ms",
        "--seed",
        str(seed),
        "--json",
        "--quiet",
    ]


def drive(
    url: str, load: Load, seed: int, *, texts: Path = TEXTS_FILE, arrivals: str = "constant"
) -> dict[str, Any]:
    """Run the generator once against ``url``; its JSON summary.

    Raises:
        RuntimeError: the generator failed or printed no JSON object.
    """
    argv = generator_argv(url, load, seed, texts=texts, arrivals=arrivals)
    limit = load.duration_s + load.deadline_ms / 1e3 + 120
    res = subprocess.run(
        argv, cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=limit, check=False
    )
    for line in reversed(res.stdout.strip().splitlines()):
        if line.startswith("{"):
            summary: dict[str, Any] = json.loads(line)
            return summary
    raise RuntimeError(
        f"generator exited {res.returncode} with no JSON: {describe(argv)}\n{res.stderr[-2000:]}"
    )
