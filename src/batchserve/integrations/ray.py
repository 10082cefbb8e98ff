"""Ray Serve hosting batchserve: the whole server in every replica, scaled on queue depth.

Theory of operation
-------------------
Ray Serve's own batching (``@serve.batch``) has a max batch size and a wait, and nothing
else: no bound on what waits, no deadlines, no refusal that says why. So each Ray replica
here runs batchserve's :class:`~batchserve.server.App` as its ASGI ingress: the same
routes (OpenAI ``/v1/embeddings``, KServe v2 ``/v2/...``, ``/metrics``), the same batcher,
admission, deadlines and statuses as ``batchserve serve``. Ray's proxy only carries each
HTTP request to a replica; everything the request meets after that is batchserve's.

* :func:`deployment` builds the Ray Serve application: :class:`BatchserveReplica` wrapped
  by ``serve.deployment`` and ``serve.ingress``, with a fixed number of replicas or
  autoscaling.
* Each replica builds its :class:`~batchserve.server.App` in its own process (the models
  load there, once, when Ray runs the app's ASGI lifespan), and reports its queue depth
  (items waiting in all its batchers) to Ray's controller through
  ``record_autoscaling_stats``, as the custom metric :data:`QUEUE_DEPTH_METRIC`.
* :class:`QueueDepthPolicy` is the autoscaling policy: as many replicas as it takes for
  the queued items to be ``target_queue_depth`` per replica or fewer, within the bounds.
  A batching server's queue, not its CPU or its open requests, says whether callers wait
  more than a pass.

Ray is an optional extra (``pip install 'batchserve[ray]'``); this module imports it only
when :func:`deployment` is called, so the policy can be used and tested without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchserve.errors import ConfigError
from batchserve.server import App, ServerSettings
from batchserve.server.transport.asgi import Message, Receive, Scope, Send

__all__ = [
    "QUEUE_DEPTH_METRIC",
    "BatchserveReplica",
    "QueueDepthPolicy",
    "Scaling",
    "deployment",
]


#: The custom autoscaling metric each replica reports: items waiting in its batchers.
QUEUE_DEPTH_METRIC = "batchserve_queue_depth"

_MISSING_RAY = (
    "Ray Serve is not installed: pip install 'batchserve[ray]' (ray[serve] 2.60 or newer)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scaling:
    """Autoscaling bounds and target for :func:`deployment`.

    Attributes:
        min_replicas: never fewer replicas (>= 1: a replica loads its model when started).
        max_replicas: never more replicas (>= ``min_replicas``).
        target_queue_depth: items waiting per replica to aim for (> 0); one full batch is
            a good start: more means a caller waits more than one pass.
        upscale_delay_s: how long the wish to scale up must last before Ray acts.
        downscale_delay_s: how long the wish to scale down must last before Ray acts.
        look_back_period_s: the window Ray averages the reported depths over; Ray wants it
            longer than ``metrics_interval_s``.
        metrics_interval_s: how often each replica pushes its depths to Ray's controller
            (Ray's own ``metrics_interval_s``): a scale-up waits up to this long to be
            seen. None keeps Ray's default (10 s). Ray 2.60 marks the field deprecated (a
            ``DeprecationWarning``) in favour of a variable it does not read yet.
    """

    min_replicas: int = 1
    max_replicas: int = 4
    target_queue_depth: float = 32.0
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 60.0
    look_back_period_s: float = 30.0
    metrics_interval_s: float | None = None

    def __post_init__(self) -> None:
        if self.min_replicas < 1:
            raise ConfigError(f"min_replicas must be >= 1, got {self.min_replicas}")
        if self.max_replicas < self.min_replicas:
            raise ConfigError(
                f"max_replicas must be >= min_replicas ({self.min_replicas}), "
                f"got {self.max_replicas}"
            )
        if not self.target_queue_depth > 0:
            raise ConfigError(f"target_queue_depth must be > 0, got {self.target_queue_depth}")
        for name in ("upscale_delay_s", "downscale_delay_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.look_back_period_s > 0:
            raise ConfigError(f"look_back_period_s must be > 0, got {self.look_back_period_s}")
        if self.metrics_interval_s is not None and not (
            0 < self.metrics_interval_s < self.look_back_period_s
        ):
            raise ConfigError(
                "metrics_interval_s must be > 0 and < look_back_period_s "
                f"({self.look_back_period_s}), got {self.metrics_interval_s}"
            )

    def ray_config(self) -> dict[str, Any]:
        """Ray Serve's ``autoscaling_config`` for these settings."""
        interval = (
            {}
            if self.metrics_interval_s is None
            else {"metrics_interval_s": self.metrics_interval_s}
        )
        return {
            **interval,
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "look_back_period_s": self.look_back_period_s,
            "policy": {
                "policy_function": f"{__name__}:QueueDepthPolicy",
                "policy_kwargs": {"target_queue_depth": self.target_queue_depth},
            },
        }


class QueueDepthPolicy:
    """Ray Serve autoscaling policy: replicas for the queued items, ``target`` per replica.

    Ray calls it with an ``AutoscalingContext`` on each autoscaling tick; it reads the
    depths the replicas reported (:data:`QUEUE_DEPTH_METRIC`, averaged over Ray's look-back
    window) and answers ``(replicas, policy_state)``: ``ceil(total / target)``, clamped to
    the context's bounds. With no report yet it keeps the current target.

    Args:
        target_queue_depth: items waiting per replica to aim for (> 0).
    """

    def __init__(self, target_queue_depth: float = 32.0) -> None:
        if not target_queue_depth > 0:
            raise ConfigError(f"target_queue_depth must be > 0, got {target_queue_depth}")
        self.target_queue_depth = target_queue_depth

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        """The number of replicas wanted now, and the (unchanged) policy state."""
        state: dict[str, Any] = dict(ctx.policy_state or {})
        metrics: Mapping[str, Mapping[Any, float]] = ctx.aggregated_metrics or {}
        depths = metrics.get(QUEUE_DEPTH_METRIC)
        if not depths:
            return ctx.target_num_replicas, state
        wanted = math.ceil(sum(depths.values()) / self.target_queue_depth)
        low, high = ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas
        return max(low, min(high, wanted)), state


class BatchserveReplica:
    """One Ray Serve replica: a whole batchserve :class:`~batchserve.server.App`.

    Ray constructs it in the replica's process; ``__serve_build_asgi_app__`` hands Ray the
    app, whose ASGI lifespan (run by Ray) loads the models and, on shutdown, drains. (The
    app is ``server``: Ray's ingress wrapper owns the attribute ``app``.)

    Args:
        settings: the server's settings, as ``batchserve serve`` builds them (host and
            port are Ray's business and ignored).
    """

    def __init__(self, settings: ServerSettings) -> None:
        self.server = App(settings)

    def __serve_build_asgi_app__(self) -> _RayIngress:
        """The ASGI app Ray routes this replica's HTTP requests to."""
        return _RayIngress(self.server)

    def queue_depth(self) -> int:
        """Items waiting in this replica's batchers now."""
        total = 0
        for model in self.server.registry.models.values():
            if model.batcher is not None:
                total += model.batcher.statistics().queue_depth
        return total

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """The custom autoscaling metric Ray collects from each replica."""
        return {QUEUE_DEPTH_METRIC: float(self.queue_depth())}


class _RayIngress:
    """The app as Ray should host it: ready once loaded, and mountable under a prefix.

    Ray counts a replica as started when the ASGI lifespan startup completes; batchserve's
    own startup returns at once (the models load in the background, answering 503 meanwhile,
    which suits a load balancer that reads readiness). Here the startup completes only once
    every model serves, so Ray routes nothing to a replica before it can serve, and a model
    that fails to load fails the replica's start. Under a ``route_prefix``, Ray passes the
    prefix as the scope's ``root_path`` with the full ``path`` (as ASGI says); the app's
    routes are its own, so the prefix is taken off the path.
    """

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":

            async def send_once_ready(message: Message) -> None:
                if message["type"] == "lifespan.startup.complete":
                    await self.app.wait_ready()
                await send(message)

            await self.app(scope, receive, send_once_ready)
            return
        root = scope.get("root_path", "")
        path = scope.get("path", "")
        if root and path.startswith(root):
            scope = {**scope, "path": path[len(root) :] or "/", "root_path": ""}
        await self.app(scope, receive, send)


def deployment(
    settings: ServerSettings,
    *,
    num_replicas: int | None = None,
    scaling: Scaling | None = None,
    name: str = "batchserve",
    ray_actor_options: Mapping[str, Any] | None = None,
) -> Any:
    """A Ray Serve application serving ``settings``'s models with batchserve in each replica.

    Run it with ``serve.run(deployment(settings, num_replicas=2), route_prefix="/")``: the
    routes are then the server's own, under Ray's HTTP proxy.

    Args:
        settings: the models and limits, as for ``batchserve serve``.
        num_replicas: a fixed number of replicas (>= 1); give this or ``scaling``, not
            both. Neither: one replica.
        scaling: autoscale on queue depth with :class:`QueueDepthPolicy`.
        name: the Ray Serve deployment's name.
        ray_actor_options: passed to Ray (e.g. ``{"num_cpus": 1}``); default: one CPU.

    Returns:
        The bound application (``ray.serve.Application``).

    Raises:
        ConfigError: both or an invalid ``num_replicas``.
        ImportError: Ray Serve is not installed (the message says what to install).
    """
    if num_replicas is not None and scaling is not None:
        raise ConfigError("give num_replicas or scaling, not both")
    if num_replicas is not None and num_replicas < 1:
        raise ConfigError(f"num_replicas must be >= 1, got {num_replicas}")
    try:
        from ray import serve
    except ImportError:
        raise ImportError(_MISSING_RAY) from None
    options: dict[str, Any] = {
        "name": name,
        "ray_actor_options": dict(ray_actor_options or {"num_cpus": 1}),
        # batchserve bounds its own queue and refuses with a reason; Ray's proxy should
        # hand requests over rather than hold them (each replica takes many at once).
        "max_ongoing_requests": max(m.batch.queue_size for m in settings.models) + 64,
    }
    if scaling is not None:
        options["autoscaling_config"] = scaling.ray_config()
    else:
        options["num_replicas"] = num_replicas or 1
    cls = serve.deployment(**options)(serve.ingress()(BatchserveReplica))
    return cls.bind(settings)
