"""Operating the server: what it tells about itself, off the inference path.

Prometheus metrics (:mod:`~batchserve.server.ops.metrics`), the live JSON status
(:mod:`~batchserve.server.ops.live`) and its dashboard
(:mod:`~batchserve.server.ops.dashboard`), OpenTelemetry traces
(:mod:`~batchserve.server.ops.tracing`), and the OpenAPI document
(:mod:`~batchserve.server.ops.openapi`). Nothing here imports from a transport.
"""
