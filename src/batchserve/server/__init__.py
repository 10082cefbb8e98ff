"""The HTTP server: OpenAI embeddings and KServe v2 in front of batched models.

``create_app(settings)`` builds the ASGI application; ``serve(settings)`` runs it on uvicorn
with the ready line, SIGTERM draining and exit status. See :mod:`batchserve.server.app`
for a request's path through the server and :mod:`batchserve.server.statuses` for the one
table from outcomes to status codes.
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
