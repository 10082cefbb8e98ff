"""The one exception tree of batchserve.

Every error the library raises derives from :class:`BatchServeError`. The tree::

    BatchServeError
    ├── ConfigError(ValueError)      a parameter broke a rule; names the parameter, rule, value
    ├── Rejected                     refused at admission, never queued; carries retry_after_s
    │   ├── QueueFull                the bounded queue is full
    │   ├── DeadlineInfeasible       the cost model predicts the deadline cannot be met
    │   └── ShuttingDown             the batcher is draining or closed
    ├── DeadlineExceeded             the deadline passed while the item was queued or running
    ├── ModelError                   the model raised for this item (cause chained)
    │   └── OutputMismatch           the model broke the contract: wrong number of outputs
    └── NotReady                     the model is still loading

Cancellation is not an error here: a caller that leaves gets ``asyncio.CancelledError``
as usual, and the item is counted as ``cancelled``.

Core errors know nothing of HTTP. The server module ``batchserve.server.statuses`` holds the
one table from these types to status codes.
"""

from __future__ import annotations

__all__ = [
    "BatchServeError",
    "ConfigError",
    "DeadlineExceeded",
    "DeadlineInfeasible",
    "ModelError",
    "NotReady",
    "OutputMismatch",
    "QueueFull",
    "Rejected",
    "ShuttingDown",
]


class BatchServeError(Exception):
    """Base class of every error batchserve raises."""


class ConfigError(BatchServeError, ValueError):
    """A parameter broke a rule. The message names the parameter, the rule and the value."""


class Rejected(BatchServeError):
    """A request refused at admission; it was never queued.

    Attributes:
        reason: machine-readable reason: ``queue_full``, ``infeasible`` or ``draining``.
        retry_after_s: estimated seconds until a retry could be admitted.
    """

    reason = "rejected"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(Rejected):
    """The bounded queue is full; the request was refused at once."""

    reason = "queue_full"


class DeadlineInfeasible(Rejected):
    """The cost model predicts the request would finish after its deadline."""

    reason = "infeasible"


class ShuttingDown(Rejected):
    """The batcher is draining or closed and admits nothing new."""

    reason = "draining"


class DeadlineExceeded(BatchServeError):
    """The request's deadline passed while it waited in the queue or during its pass.

    Attributes:
        during_pass: True when the deadline passed while the item's forward pass was
            running (the item is counted ``late``), False when it passed in the queue
            (counted ``expired``).
    """

    def __init__(self, message: str = "", *, during_pass: bool = False) -> None:
        super().__init__(message)
        self.during_pass = during_pass


class ModelError(BatchServeError):
    """The model raised for this input; the original exception is chained as ``__cause__``."""


class OutputMismatch(ModelError):
    """The model returned a number of outputs different from the number of inputs."""


class NotReady(BatchServeError):
    """The model is still loading (or failed to load) and cannot serve yet.

    Attributes:
        retry_after_s: estimated seconds until it may be ready.
    """

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
