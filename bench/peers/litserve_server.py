"""LitServe serving the benchmark's model with LitServe's own dynamic batching.

``LitAPI(max_batch_size=..., batch_timeout=...)`` is LitServe's batching: its inference
worker (a separate process, one per device) collects up to ``max_batch_size`` decoded
requests, waiting at most ``batch_timeout`` seconds, then calls ``predict`` with the list.
One API server process, one inference worker, the CPU accelerator, and ZeroMQ between
them (``fast_queue``, which LitServe advises above 100 requests/s). LitServe has no queue
bound and no per-request deadline; ``--queue-size`` is ignored.

Run: ``bench/.venvs/litserve/bin/python bench/peers/litserve_server.py --port 8000``
"""

from typing import Any

import litserve as ls
from _common import BatchFn, build_model, embedding_reply, peer_args, text_of


class EmbeddingAPI(ls.LitAPI):  # type: ignore[misc]
    """The OpenAI embeddings contract on LitServe's batching loop."""

    def __init__(self, args: Any) -> None:
        super().__init__(
            max_batch_size=args.max_batch,
            batch_timeout=args.max_wait_ms / 1e3,
            api_path="/v1/embeddings",
        )
        self.args = args
        self.model: BatchFn | None = None

    def setup(self, device: str) -> None:
        self.model = build_model(self.args)

    # No annotation on ``request``: LitServe reads it as the FastAPI body type, and an
    # unannotated one is the raw Request (a dict annotation would demand a query field).
    def decode_request(self, request) -> tuple[str, str]:  # type: ignore[no-untyped-def]
        return str(request.get("model", "")), text_of(request)

    def batch(self, inputs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return inputs

    def predict(self, x: Any) -> Any:
        # Batched: a list of (model, text); unbatched (max_batch 1): one (model, text).
        items = x if isinstance(x, list) else [x]
        assert self.model is not None
        vectors = self.model([text for _, text in items])
        out = [(name, vec, text) for (name, text), vec in zip(items, vectors, strict=True)]
        return out if isinstance(x, list) else out[0]

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output

    def encode_response(self, output: tuple[str, list[float], str]) -> dict:  # type: ignore[type-arg]
        name, vector, text = output
        return embedding_reply(name, vector, text)


def main() -> None:
    args = peer_args(__doc__.splitlines()[0])
    # fast_queue: ZeroMQ between the API server and the worker, which LitServe's own docs
    # advise above 100 requests/s (the default multiprocessing queues are far slower).
    server = ls.LitServer(
        EmbeddingAPI(args),
        accelerator="cpu",
        devices=1,
        workers_per_device=1,
        timeout=60,
        fast_queue=True,
    )
    server.run(
        host=args.host,
        port=args.port,
        num_api_servers=1,
        log_level="warning",
        generate_client_file=False,
    )


if __name__ == "__main__":
    main()
