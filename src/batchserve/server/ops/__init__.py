"""Operating the server: what it tells about itself, off the inference path.

Prometheus metrics (:mod:`~batchserve.server.ops.metrics`), the live JSON status
(:mod:`~batchserve.server.ops.live`) and its dashboard
(:mod:`~batchserve.server.ops.dashboard`), OpenTelemetry traces
(:mod:`~batchserve.server.ops.tracing`), the OpenAPI document
(:mod:`~batchserve.server.ops.openapi`) and the ``/docs`` page rendered from it
(:mod:`~batchserve.server.ops.docs_page`). Nothing here imports from a transport.
"""
