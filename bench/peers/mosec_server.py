"""Mosec serving the benchmark's model with Mosec's own dynamic batching.

Mosec's Rust front end queues requests (``--capacity`` bounds the queue: a request beyond it
is refused with 429) and hands a worker process up to ``max_batch_size`` of them, waiting at
most ``max_wait_time`` milliseconds. One worker process, the route ``/v1/embeddings``.
Mosec has no per-request deadline; its ``--timeout`` (one forward pass) is left at 3 s.

Run: ``bench/.venvs/mosec/bin/python bench/peers/mosec_server.py --port 8000``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from _common import build_model, embedding_reply, peer_args, text_of
from mosec import Server, ValidationError, Worker

_ARGS_ENV = "BENCH_PEER_ARGS"


class Embed(Worker):  # type: ignore[misc]
    """One forward pass over a batch of decoded OpenAI embedding requests."""

    def __init__(self) -> None:
        super().__init__()
        # The worker is a spawned process: it gets the parsed arguments through its env.
        self.args = argparse.Namespace(**json.loads(os.environ[_ARGS_ENV]))
        self.model = build_model(self.args)

    def forward(self, data: Any) -> Any:
        # Mosec hands a list only when dynamic batching is on (max batch > 1).
        if not isinstance(data, list):
            return self._forward([data])[0]
        return self._forward(data)

    def _forward(self, data: list[Any]) -> list[dict[str, Any]]:
        items: list[tuple[str, str]] = []
        for body in data:
            try:
                items.append((str(body.get("model", "")), text_of(body)))
            except (ValueError, AttributeError) as exc:
                raise ValidationError(str(exc)) from None
        vectors = self.model([text for _, text in items])
        return [
            embedding_reply(name, vec, text)
            for (name, text), vec in zip(items, vectors, strict=True)
        ]


def main() -> None:
    args = peer_args(__doc__.splitlines()[0])
    # Mosec reads its own options from sys.argv when the Server is built.
    sys.argv = [
        sys.argv[0],
        "--address",
        args.host,
        "--port",
        str(args.port),
        "--capacity",
        str(args.queue_size),
        "--log-level",
        "warning",
    ]
    server = Server()
    server.append_worker(
        Embed,
        num=1,
        max_batch_size=args.max_batch,
        max_wait_time=max(1, round(args.max_wait_ms)),
        env=[{_ARGS_ENV: json.dumps(vars(args))}],
        route="/v1/embeddings",
    )
    server.run()


if __name__ == "__main__":
    main()
