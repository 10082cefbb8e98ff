"""The baseline: a plain FastAPI endpoint with no batching, one forward pass per request.

The endpoint is a plain ``def``, so FastAPI runs it in its thread pool; the model's device
lock (see ``_common``) makes the passes take turns, as on one accelerator. Nothing bounds
the requests waiting for the lock, and nothing gives up on a caller who left: this is what
a first deployment looks like. Max batch and max wait are ignored (there is no batching).

Run: ``bench/.venvs/fastapi/bin/python bench/peers/fastapi_server.py --port 8000``
"""

from __future__ import annotations

from typing import Any

import uvicorn
from _common import build_model, embedding_reply, peer_args, text_of
from fastapi import Body, FastAPI, HTTPException


def main() -> None:
    args = peer_args(__doc__.splitlines()[0])
    model = build_model(args)
    app = FastAPI()

    @app.post("/v1/embeddings")
    def embeddings(body: Any = Body(...)) -> dict[str, Any]:  # noqa: B008
        try:
            text = text_of(body)
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        [vector] = model([text])
        return embedding_reply(str(body.get("model", "")), vector, text)

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
