"""batchserve's application serving the null model, for HTTP servers that import an app.

``app`` is the ASGI application (``uvicorn bench.null_app:app``, ``granian --interface asgi
null_app:app``) serving ``m``: a synthetic model that costs nothing and answers 8 floats,
max batch 64, max wait 2 ms, queue 1024, the yardstick's settings.
"""

from __future__ import annotations

from batchserve.config import BatchConfig
from batchserve.server import App, ModelSettings, ServerSettings

NULL_SPEC = "synthetic:fixed=0ms,per_item=0ms,dim=8"
BATCH = BatchConfig(max_batch_size=64, max_wait_s=0.002, queue_size=1024)

app = App(ServerSettings(models=(ModelSettings(name="m", spec=NULL_SPEC, batch=BATCH),), port=0))
