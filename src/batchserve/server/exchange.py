"""One inference request's life, from its head to its answer, with no I/O of its own.

Theory of operation
-------------------
An :class:`Exchange` is what the server knows of one inference request. Three transports run
it, exactly as two drivers run the batching policy: the connection protocol
(:mod:`batchserve.server.transport.httptools`, the fast path: no task, future or timer per
request), the ASGI driver (:mod:`batchserve.server.transport.asgi`, for in-process clients
and everything else) and the gRPC transport (:mod:`batchserve.server.transport.grpc`). All
call the same steps and receive the answer through the same callback, so a request is
answered alike whichever transport carried it (``bench/rsgi_app.py``, a fourth on a
:class:`Gate` alone, shows that a new one needs nothing else).

1. :meth:`App.begin <batchserve.server.app.App.begin>` opens it from the request's head
   alone: the request is counted received, and the application decides what needs no body
   (API key and tenant, media type, declared length, the deadline from the wire, a model
   that does not exist) as a :class:`HeadVerdict`, which :meth:`Exchange.open` applies:
   then the exchange's own admission (:meth:`_admit`: draining, a deadline passed) and,
   once the model is known, the batcher's verdict on one more item (queue full, deadline
   infeasible). A refusal is answered before the body is read, let alone parsed: refusing
   must stay far cheaper than serving.
2. :meth:`Exchange.feed` takes the whole body: the endpoint (OpenAI, KServe, gRPC) parses
   and checks it and returns what it found as a :class:`Parsed` (the model, the request,
   its items, a timeout and a class of work from the body); the exchange applies it, takes
   its class and tenant from the application (:meth:`Host.classify`), admits it again
   (:meth:`_admit`, the same check) and offers the inputs to the model's batcher, each with
   this exchange as its :class:`~batchserve.batcher.Waiter`. A refusal of any input
   withdraws the others.
3. :meth:`Exchange.settle` is called by the batcher as each input ends; the last one builds
   the answer. An error of any input answers the request with it and withdraws the rest.

The exchange is the only writer of its state (as h11's ``Connection`` is of one
connection's; ``tests/test_package.py`` holds every other module to it): the application
and the endpoints return values, and read an exchange but never assign its fields.

A transport sees the application as a :class:`Gate` (which requests are exchanges, and
opening one); an exchange sees it as a :class:`Host` (drain, metrics, classes, release).
Neither names the application's class, and this module imports nothing from a transport or
from the server's operations (metrics, views), so a new transport needs only this module.

Every exchange ends exactly once, through :meth:`_finish`: its outcome is counted, then the
driver's ``respond`` callback gets the :class:`Reply` (a client that left gets none:
:meth:`abandon`). The driver calls :meth:`release` once the reply is written, which is what
a drain waits for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from batchserve.batcher import Served
from batchserve.errors import DeadlineExceeded, Rejected
from batchserve.server.http import JSON_TYPE, Head, Headers
from batchserve.server.statuses import ApiError, from_exception, retry_after_ms

if TYPE_CHECKING:
    from batchserve.clock import Clock
    from batchserve.policy import ClassConfig, WorkClass
    from batchserve.server.registry import ServedModel
    from batchserve.server.settings import RequestLimits

__all__ = [
    "ARRIVAL",
    "SERVER_TIMING",
    "TIMING_HEADERS",
    "Endpoint",
    "Exchange",
    "Gate",
    "HeadVerdict",
    "Host",
    "ParseError",
    "Parsed",
    "RequestMeter",
    "Reply",
    "passed",
    "timing_head",
]

log = logging.getLogger("batchserve.server")

#: The response headers on every inference answer, one comma-separated value per input
#: (rendered by :func:`timing_head`; the OpenAPI document describes them from here).
TIMING_HEADERS = {
    "X-Queue-Wait-S": "Seconds each input waited from admission to its forward pass.",
    "X-Batch-Size": "Items in the forward pass of each input.",
    "X-Batch-Id": "Id of the forward pass of each input (unique per model).",
    "X-Forward-S": "Seconds the forward pass of each input took.",
}
_QUEUE_WAIT, _BATCH_SIZE, _BATCH_ID, _FORWARD = (h.lower().encode() for h in TIMING_HEADERS)

#: The response header with the server's own time for the request (every inference answer).
SERVER_TIMING = "Server-Timing"
_SERVER_TIMING_LINE = SERVER_TIMING.lower().encode() + b": total;dur=%.3f\r\n"

#: The key of the ASGI scope's ``extensions`` under which the connection protocol puts the
#: time (on the server's clock) the request's first byte arrived.
ARRIVAL = "batchserve.arrival"


class Reply:
    """An answer to send: status, headers (besides type and length), body, media type.

    ``head`` holds more header lines, already rendered (each ``name: value`` and CRLF, names in
    lower case), sent after ``headers``: the timing headers of every answer, written with
    one format instead of a pair each (``bench/server/request_path.py --via inprocess``: the loop's
    CPU per request from 35.1 to 32.4 us), a cached refusal's headers, and
    ``Server-Timing``. The connection protocol writes them as they are;
    :meth:`all_headers` gives them as pairs to an ASGI server, in the same order.
    """

    __slots__ = ("body", "content_type", "head", "headers", "status")

    def __init__(
        self,
        status: int,
        headers: Headers,
        body: bytes,
        content_type: bytes = JSON_TYPE,
        head: bytes = b"",
    ) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.content_type = content_type
        self.head = head

    def all_headers(self) -> Headers:
        """``headers``, then the lines of ``head``, as (name, value) pairs."""
        pairs = list(self.headers)
        for line in self.head.split(b"\r\n"):
            if line:
                name, _, value = line.partition(b": ")
                pairs.append((name, value))
        return pairs


class Parsed(NamedTuple):
    """What an endpoint found in a request's body: :meth:`Endpoint.parse` returns it.

    A tuple (built once per request: a third of a frozen dataclass's cost), never changed;
    the exchange applies it.

    Attributes:
        model: the model the request is for: the one its body names, else the path's
            (``exchange.model`` when ``parse`` is called).
        request: the parsed body, in the endpoint's own type; its ``answer`` reads it back
            as ``exchange.request``.
        items: the inputs to run, in order (the answer has one result per item).
        timeout_s: the seconds from the request's arrival its body allows (KServe's
            ``parameters.timeout``); the exchange keeps the tighter of that deadline and
            the head's. None: the body sets none.
        work_class: the class of work its body names, resolved against ``model.classes``
            (KServe's ``parameters.priority``). None: the head's (``X-Priority``), else the
            model's default class; always None for a model without classes.
    """

    model: ServedModel
    request: Any
    items: list[Any]
    timeout_s: float | None = None
    work_class: WorkClass | None = None


class ParseError(Exception):
    """Raised by :meth:`Endpoint.parse` for a body that named its model, then broke a rule.

    The exchange answers ``error`` and counts it against ``model``, as it would a refusal
    of that model's. An error found before the body names a model is raised as it is.

    Args:
        model: the model the body named.
        error: what to answer (an :class:`~batchserve.server.statuses.ApiError`, a
            :class:`~batchserve.errors.NotReady`...).
    """

    def __init__(self, model: ServedModel, error: Exception) -> None:
        super().__init__(str(error))
        self.model = model
        self.error = error


class HeadVerdict(NamedTuple):
    """The application's verdict on a request's head: :meth:`Exchange.open` applies it.

    Attributes:
        model: the model the head names (the path's); with ``named`` False, the only model
            served, for the head's refusals and the queue's screening alone (the body names
            the model). None: only the body can tell.
        named: whether the head named ``model`` (it stands) or only guessed it.
        deadline: the absolute deadline the head's fields state (server clock); None: none.
        tenant: the tenant the request's key named; None: none (the ``X-Tenant`` header's
            is read by :meth:`Host.classify`, for models with classes).
        refusal: the error to answer at once (the fields before it are what was known when
            it was found); None: the head is admitted so far (the exchange's own admission,
            and the batcher's screening, still to come).
    """

    model: ServedModel | None
    named: bool = False
    deadline: float | None = None
    tenant: str | None = None
    refusal: Exception | None = None


class Endpoint(Protocol):
    """What a protocol (OpenAI, KServe, gRPC) contributes to an exchange.

    An endpoint reads an exchange (``model`` when the path named it, ``head``, ``arrival``,
    ``request`` in ``answer``) but never assigns its fields: it returns values.
    """

    #: ``openai``, ``kserve`` or ``grpc``: the metrics label.
    protocol: str
    #: The media types its bodies may be sent as.
    body_types: frozenset[str]

    def parse(self, exchange: Exchange, body: bytes) -> Parsed:
        """Parse and check ``body``: the model, the request and its items, and what it sets.

        Raises:
            ApiError: the body breaks a rule (the message names the field), found before
                the body named a model.
            ParseError: the body named its model, then broke a rule (or the model is not
                ready): the error is counted against the model.
        """

    def answer(self, exchange: Exchange, served: list[Served[Any]]) -> Reply:
        """The 200 answer, from every input's result in input order."""

    def error_body(self, error: ApiError) -> bytes:
        """The protocol's error body."""


class RequestMeter(Protocol):
    """Where an exchange counts its outcome (the server's metrics)."""

    def observe_request(
        self,
        model: str | None,
        protocol: str,
        reason: str,
        seconds: float,
        *,
        outcome: str | None = None,
    ) -> None:
        """Count one inference request's outcome (``reason`` ``ok`` for a success)."""


class Host(Protocol):
    """What an exchange needs of the application that opened it."""

    @property
    def clock(self) -> Clock:
        """The server's one clock (its batchers', and the arrivals')."""

    @property
    def draining(self) -> bool:
        """Whether the server admits no new requests."""

    @property
    def metrics(self) -> RequestMeter:
        """Where the exchange's outcome is counted."""

    def classify(
        self, head: Head, classes: ClassConfig, named: WorkClass | None, tenant: str | None
    ) -> tuple[WorkClass, str | None]:
        """The class of work and the tenant of a request to a model with ``classes``.

        Args:
            head: the request's head.
            classes: the model's classes.
            named: the class its body named (it stands); None: none.
            tenant: the tenant its key named; None: none.

        Raises:
            ApiError: 422 for an unknown class or a bad header value.
        """

    def release(self) -> None:
        """The exchange's reply was written (or its client left)."""


class Gate(Protocol):
    """What a transport needs of the application: which requests are exchanges, opening one."""

    @property
    def clock(self) -> Clock:
        """The server's one clock: a request's arrival is read from it."""

    @property
    def limits(self) -> RequestLimits:
        """The limits on a request (body size, read timeout)."""

    @property
    def draining(self) -> bool:
        """Whether the server admits no new requests (its answers close the connection)."""

    def inference_route(self, method: str, path: str) -> tuple[Endpoint, str | None] | None:
        """The endpoint and model name (None: named by the body) of an inference request."""

    def begin(
        self,
        endpoint: Endpoint,
        model_name: str | None,
        head: Head,
        arrival: float,
        respond: Callable[[Reply], None] | None,
    ) -> Exchange:
        """Open an inference exchange from the request's head (see ``App.begin``)."""


def timing_head(served: list[Served[Any]]) -> bytes:
    """The timing headers of an answer, rendered: one comma-separated value per input.

    ``X-Queue-Wait-S``, ``X-Batch-Size``, ``X-Batch-Id`` and ``X-Forward-S``, in that order,
    as :attr:`Reply.head` lines.
    """
    if len(served) == 1:
        s = served[0]
        return _TIMING_ONE % (s.queue_wait_s, s.batch_size, s.batch_id, s.forward_s)
    return _TIMING_MANY % (
        b",".join(b"%.6f" % s.queue_wait_s for s in served),
        b",".join(b"%d" % s.batch_size for s in served),
        b",".join(b"%d" % s.batch_id for s in served),
        b",".join(b"%.6f" % s.forward_s for s in served),
    )


_TIMING_ONE = b"%s: %%.6f\r\n%s: %%d\r\n%s: %%d\r\n%s: %%.6f\r\n" % (
    _QUEUE_WAIT,
    _BATCH_SIZE,
    _BATCH_ID,
    _FORWARD,
)
_TIMING_MANY = b"%s: %%s\r\n%s: %%s\r\n%s: %%s\r\n%s: %%s\r\n" % (
    _QUEUE_WAIT,
    _BATCH_SIZE,
    _BATCH_ID,
    _FORWARD,
)


class Exchange:
    """One inference request, from its head to its answer (see the module docstring).

    Attributes:
        app: the application it belongs to (as its :class:`Host`).
        endpoint: its protocol.
        head: its headers that the server reads.
        arrival: when its first byte arrived (on the server's clock, its batchers').
        model: the model it asks for, once known.
        request: the parsed body (the endpoint's own type), once parsed.
        deadline: its absolute deadline: from the wire, the body, else its class's or the
            model's default.
        work_class: its class of work, once known (models with classes only).
        tenant: its tenant (models with classes only; None: none).
        respond: the driver's callback for the reply.
        reply: the reply, once there is one.
    """

    __slots__ = (
        "app",
        "arrival",
        "deadline",
        "endpoint",
        "entries",
        "head",
        "model",
        "pending",
        "released",
        "reply",
        "request",
        "respond",
        "results",
        "tenant",
        "work_class",
    )

    def __init__(
        self,
        app: Host,
        endpoint: Endpoint,
        head: Head,
        arrival: float,
        respond: Callable[[Reply], None] | None,
    ) -> None:
        self.app = app
        self.endpoint = endpoint
        self.head = head
        self.arrival = arrival
        self.respond = respond
        self.model: ServedModel | None = None
        self.request: Any = None
        self.deadline: float | None = None
        self.entries: list[Any] = []
        self.results: list[Any] = []
        self.pending = 0
        self.reply: Reply | None = None
        self.released = False
        self.work_class: WorkClass | None = None
        self.tenant: str | None = None

    @property
    def done(self) -> bool:
        """Whether the exchange has ended (answered, or its client left)."""
        return self.reply is not None

    # -- the steps -------------------------------------------------------------------------

    def open(self, verdict: HeadVerdict, now: float) -> None:
        """Apply the application's verdict on the head, made at ``now`` (``App.begin``).

        A refusal in the verdict is answered at once; else the exchange admits the request
        (:meth:`_admit`) and, the model known, has its batcher screen one more item with
        the deadline and class the head gives. Refused: ``done`` is True and the body is not
        to be read; else the driver reads it and calls :meth:`feed`.
        """
        model, named, self.deadline, self.tenant, refusal = verdict
        self.model = model
        if refusal is not None:
            self.fail(refusal)
            return
        if model is None:
            try:
                self._admit(None)  # the deadline waits for the model, which the body names
            except Exception as exc:
                self.fail(exc)
            return
        try:
            self._admit(now)
            # The attribute first: the call (which raises NotReady) only while it loads.
            batcher = model.batcher or model.require_batcher()
            classes = model.classes
            deadline = self.deadline
            if classes is None:
                refused = batcher.screen(
                    deadline if deadline is not None else model.deadline_for(None, self.arrival)
                )
            else:
                work_class, self.tenant = self.app.classify(self.head, classes, None, self.tenant)
                self.work_class = work_class
                if deadline is None:
                    deadline = model.deadline_for(work_class.timeout_s, self.arrival)
                refused = batcher.screen(deadline, work_class.name, self.tenant)
        except Exception as exc:
            self.fail(exc)
            return
        if refused is not None:
            self.fail(refused)  # not raised: a refusal is the common case under load
        elif not named:
            self.model = None  # the body names the model

    def feed(self, body: bytes) -> None:
        """Parse the whole body and offer its inputs; the answer comes through ``respond``."""
        if self.reply is not None:
            return
        try:
            try:
                parsed = self.endpoint.parse(self, body)
            except ParseError as exc:
                self.model = exc.model
                self.fail(exc.error)
                return
            model, self.request, items, timeout_s, work_class = parsed
            self.model = model
            arrival = self.arrival
            deadline = self.deadline
            if timeout_s is not None:
                own = arrival + timeout_s
                if deadline is None or own < deadline:
                    deadline = self.deadline = own
            classes = model.classes
            if classes is not None:
                work_class, self.tenant = self.app.classify(
                    self.head, classes, work_class or self.work_class, self.tenant
                )
                self.work_class = work_class
            if deadline is None:
                class_s = None if work_class is None else work_class.timeout_s
                deadline = self.deadline = model.deadline_for(class_s, arrival)
            self._admit(self.app.clock.now())
            batcher = model.batcher or model.require_batcher()
            self.results = [None] * len(items)
            self.pending = len(items)
            entries = self.entries
            if work_class is None:
                for i, item in enumerate(items):
                    entries.append(batcher.offer(item, deadline, self, i))
            else:
                name, tenant = work_class.name, self.tenant
                for i, item in enumerate(items):
                    entries.append(batcher.offer(item, deadline, self, i, name, tenant))
        except Exception as exc:
            self._withdraw()
            self.fail(exc)

    def settle(self, index: int, served: Served[Any] | None, error: BaseException | None) -> None:
        """The batcher's answer for input ``index`` (the :class:`Waiter` side)."""
        if self.reply is not None:
            return
        if error is not None:
            self._withdraw()
            self.fail(error)
            return
        self.results[index] = served
        self.pending -= 1
        if self.pending:
            return
        try:
            reply = self.endpoint.answer(self, self.results)
        except Exception as exc:
            self.fail(exc)
            return
        self._finish(reply, "ok")

    def fail(self, exc: BaseException) -> None:
        """End with the error answer for ``exc`` (the status table decides which)."""
        if self.reply is not None:
            return
        self._finish(*self._error(exc))

    def _error(self, exc: BaseException) -> tuple[Reply, str, str | None]:
        if isinstance(exc, Rejected):
            return self._refusal(exc), exc.reason, None
        error = from_exception(exc)
        if error.reason == "internal":
            log.error("internal error on an inference request", exc_info=exc)
        outcome = "late" if isinstance(exc, DeadlineExceeded) and exc.during_pass else None
        return (
            Reply(error.status, error.headers(), self.endpoint.error_body(error)),
            error.reason,
            outcome,
        )

    def _refusal(self, exc: Rejected) -> Reply:
        # Under overload the same refusal goes out thousands of times a second: its body
        # and header lines (rendered: a refusal's never close the connection) are built
        # once per protocol, reason, message and Retry-After-Ms.
        key = (self.endpoint.protocol, exc.reason, str(exc), retry_after_ms(exc.retry_after_s))
        known = _REFUSALS.get(key)
        if known is None:
            if len(_REFUSALS) >= _MAX_REFUSALS:
                _REFUSALS.clear()
            error = from_exception(exc)
            headers = error.headers()
            assert all(name != b"connection" for name, _ in headers)
            known = _REFUSALS[key] = (
                error.status,
                b"".join(b"%s: %s\r\n" % pair for pair in headers),
                self.endpoint.error_body(error),
            )
        return Reply(known[0], [], known[2], head=known[1])

    def abandon(self) -> None:
        """The client left: its inputs are withdrawn (queued ones never reach the model)."""
        if self.reply is not None:
            return
        self._withdraw()
        self.reply = _GONE
        self._count("cancelled", None, self.app.clock.now() - self.arrival)

    def release(self) -> None:
        """The driver has written the reply (or the client left): the request is over."""
        if not self.released:
            self.released = True
            self.app.release()

    # -- internals -------------------------------------------------------------------------

    def _admit(self, now: float | None) -> None:
        """The admission of a request, from its head and again with its body: the one check.

        Refused while the server drains, and once its deadline has passed at ``now`` (None:
        its model is not known yet, so its deadline is checked once the body names it and
        a refusal is counted against that model).

        Raises:
            ApiError: ``draining`` (503), ``deadline_exceeded`` (504).
        """
        if self.app.draining:
            raise ApiError("draining", "the server is shutting down and admits no new requests")
        deadline = self.deadline
        if now is not None and deadline is not None and deadline <= now:
            raise passed(now - self.arrival)

    def _withdraw(self) -> None:
        model = self.model
        if not self.entries or model is None or model.batcher is None:
            return
        batcher = model.batcher
        for entry in self.entries:
            batcher.withdraw(entry)
        self.entries = []

    def _finish(self, reply: Reply, reason: str, outcome: str | None = None) -> None:
        now = self.app.clock.now()
        if reason == "ok" and self.deadline is not None and now > self.deadline:
            # The passes ended in time but the answer was built after the deadline (the
            # process was not given the CPU): a late answer is a 504, never a 200.
            late = DeadlineExceeded(
                f"deadline passed after {now - self.arrival:.4f}s, as its answer was built",
                during_pass=True,
            )
            reply, reason, outcome = self._error(late)
        self.reply = reply
        elapsed = now - self.arrival
        # The server's own account of the request, arrival to answer, in the standard
        # header (milliseconds): a client on a starved core can tell its time from ours.
        reply.head += _SERVER_TIMING_LINE % (elapsed * 1e3)
        self._count(reason, outcome, elapsed)
        respond = self.respond
        if respond is not None:
            respond(reply)

    def _count(self, reason: str, outcome: str | None, elapsed: float) -> None:
        model = self.model
        self.app.metrics.observe_request(
            model.name if model is not None else None,
            self.endpoint.protocol,
            reason,
            elapsed,
            outcome=outcome,
        )


def passed(waited: float) -> ApiError:
    """The 504 of a request whose deadline passed ``waited`` seconds after its arrival."""
    return ApiError(
        "deadline_exceeded",
        f"the request's deadline passed {waited:.4f}s after it arrived, before it was admitted",
    )


#: Refusal replies built so far: (protocol, reason, message, Retry-After-Ms) -> (status,
#: rendered header lines, body); cleared when full (refusal messages name figures that
#: change with load).
_REFUSALS: dict[tuple[str, str, str, int], tuple[int, bytes, bytes]] = {}
_MAX_REFUSALS = 256

#: The reply of an exchange whose client left: nothing is sent.
_GONE = Reply(499, [], b"")
