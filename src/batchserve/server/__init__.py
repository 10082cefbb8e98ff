"""The HTTP server: OpenAI embeddings and KServe v2 in front of batched models.

``create_app(settings)`` builds the ASGI application; :func:`batchserve.server.run.serve`
runs it on uvicorn with the ready line, SIGTERM draining and exit status.

The package follows a request's life:

* ``transport/``: what carries its bytes: the connection protocol on uvicorn's httptools
  (``httptools``) with its head guard (``guard``), the ASGI driver (``asgi``), and gRPC
  (``grpc``);
* ``exchange``: the request from its head to its answer, with no I/O of its own; ``http``:
  its head and JSON bodies; ``deadlines``: its deadline from the wire; ``tenancy``: its
  class of work and tenant;
* ``protocols/``: what its body and answer look like: OpenAI, KServe v2 (and its tensors),
  Triton's extensions;
* ``app``: the verdict on its head, the models (``registry``), the drain; ``settings``:
  the server's frozen settings, and ``config_file``: the config file's schema and the
  precedence of its layers under the flags; ``statuses``: the one table from outcomes to
  status codes; ``account``: the passes' live account; ``routes``: every route
  that is not inference; ``run``: the process;
* ``ops/``: what the server tells of itself: metrics, the live status and its dashboard,
  traces, the OpenAPI document.

The exchange and the protocols import nothing from ``transport/`` or ``ops/``
(``tests/test_package.py``).
"""

from batchserve.server.app import App, create_app
from batchserve.server.settings import (
    DEFAULT_MODEL_NAME,
    ModelSettings,
    RequestLimits,
    ServerSettings,
)
from batchserve.server.statuses import STATUS_TABLE, ApiError

__all__ = [
    "DEFAULT_MODEL_NAME",
    "STATUS_TABLE",
    "ApiError",
    "App",
    "ModelSettings",
    "RequestLimits",
    "ServerSettings",
    "create_app",
]
