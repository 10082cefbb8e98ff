"""fastembed (ONNX Runtime, in process) encoding the built-in MiniLM: texts/s, no server.

fastembed downloads its own ONNX models, so it cannot load all-MiniLM-L6-v2 offline by
name. It is given the ONNX file that batchserve exports from the shipped weights
(``--model-file``: the whole sentence-transformers pipeline, pooled and normalized, so the
custom model has no pooling and no normalization of its own) and the model folder's
tokenizer files (``--source``), through ``TextEmbedding.add_custom_model`` and
``specific_model_path``: nothing is downloaded.

It encodes the texts of ``--texts`` (one per line) as given and, as its best case, sorted
by length (fastembed pads each batch to its longest text and does not sort), at each
``--batch-sizes`` and ``--threads``, and prints one JSON object: texts/s by
``"<threads> threads, batch <b>[, sorted]"``.

With ``--per-request N`` it encodes as a server would answer requests of N texts: each
run of N consecutive texts on its own (``embed(request, batch_size=b)``), as given and
sorted by length within the request, for ``--seconds`` per setting (the texts cycled; 0:
once through), and counts the texts of the requests done.

Run (in its venv): ``bench/.venvs/fastembed/bin/python bench/peers/fastembed_encode.py
--model-file M --source DIR --texts FILE``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-file", required=True, help="batchserve's exported model.onnx")
    ap.add_argument("--source", required=True, help="the model folder (tokenizer files)")
    ap.add_argument("--texts", required=True, help="one text per line")
    ap.add_argument("--batch-sizes", default="8,16,32,64")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--per-request", type=int, default=0, help="texts per request (0: all)")
    ap.add_argument("--seconds", type=float, default=0.0, help="per setting, --per-request")
    args = ap.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    lines = Path(args.texts).read_text(encoding="utf-8").splitlines()
    texts = [line.strip() for line in lines if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "onnx").mkdir()
        for name in TOKENIZER_FILES:
            if (Path(args.source) / name).exists():
                shutil.copy(Path(args.source) / name, folder / name)
        shutil.copy(args.model_file, folder / "onnx" / "model.onnx")
        TextEmbedding.add_custom_model(
            model="batchserve/all-MiniLM-L6-v2",
            pooling=PoolingType.DISABLED,
            normalization=False,
            sources=ModelSource(hf="batchserve/all-MiniLM-L6-v2"),
            dim=384,
            model_file="onnx/model.onnx",
        )
        out: dict[str, float] = {}
        for threads in (int(t) for t in args.threads.split(",")):
            model = TextEmbedding(
                "batchserve/all-MiniLM-L6-v2", specific_model_path=str(folder), threads=threads
            )
            list(model.embed(texts[:64], batch_size=32))
            for b in (int(b) for b in args.batch_sizes.split(",")):
                if args.per_request:
                    for label, sort in (("", False), (", sorted", True)):
                        key = f"{threads} threads, batch {b}{label}"
                        out[key] = _per_request(model, texts, args, b, sort=sort)
                    continue
                for label, order in (("", texts), (", sorted", sorted(texts, key=len))):
                    t0 = time.perf_counter()
                    list(model.embed(order, batch_size=b))
                    out[f"{threads} threads, batch {b}{label}"] = len(order) / (
                        time.perf_counter() - t0
                    )
    print(json.dumps(out))


def _per_request(model: Any, texts: list[str], args: Any, batch: int, *, sort: bool) -> float:
    """Texts/s, each request of ``args.per_request`` texts embedded on its own."""
    n = args.per_request
    requests = [texts[i : i + n] for i in range(0, len(texts), n)]
    if sort:
        requests = [sorted(r, key=len) for r in requests]
    done, i = 0, 0
    t0 = time.perf_counter()
    while True:
        request = requests[i % len(requests)]
        list(model.embed(request, batch_size=batch))
        done, i = done + len(request), i + 1
        elapsed = time.perf_counter() - t0
        if (args.seconds and elapsed >= args.seconds) or (not args.seconds and i == len(requests)):
            return done / elapsed


if __name__ == "__main__":
    main()
