"""The exchange driven as a state machine: no socket, no transport, no application.

As h11 tests its ``Connection`` by handing it events and reading back what it says, these
tests open an :class:`Exchange` on a fake host and a fake endpoint (plain classes), apply
head verdicts, feed bodies, settle inputs as a batcher would, and assert every
:class:`Reply` exactly: status, headers, header lines, body. The clock is a
:class:`ManualClock`, so the ``Server-Timing`` line and every deadline are exact.

Most tests give the model a fake queue (what the exchange asks of a batcher: ``screen``,
``offer``, ``withdraw``), which records what reached it; the last ones run a real
:class:`Batcher` on the manual clock with a fake model, to show that a client that leaves
costs no model time and that the policy's own refusal is answered as it says.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest

from batchserve.batcher import Batcher, Served
from batchserve.clock import ManualClock
from batchserve.config import BatchConfig
from batchserve.errors import (
    DeadlineInfeasible,
    ModelError,
    QueueFull,
    Rejected,
    ShuttingDown,
)
from batchserve.policy import ClassConfig, WorkClass
from batchserve.server.exchange import (
    Exchange,
    HeadVerdict,
    Parsed,
    ParseError,
    Reply,
    timing_head,
)
from batchserve.server.http import JSON_TYPE, Head
from batchserve.server.registry import ServedModel
from batchserve.server.settings import ModelSettings
from batchserve.server.statuses import ApiError

#: Every test starts its clock here: an arrival of 100 s, in binary-exact steps after it.
T0 = 100.0

# -- the fakes ---------------------------------------------------------------------------


class Meter:
    """The host's metrics: each outcome an exchange counts, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str, str, float, str | None]] = []

    def observe_request(
        self,
        model: str | None,
        protocol: str,
        reason: str,
        seconds: float,
        *,
        outcome: str | None = None,
    ) -> None:
        self.seen.append((model, protocol, reason, seconds, outcome))


class FakeHost:
    """The application as an exchange sees it: a clock, a drain flag, metrics, classes."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.draining = False
        self.metrics = Meter()
        self.released = 0

    def classify(
        self, head: Head, classes: ClassConfig, named: WorkClass | None, tenant: str | None
    ) -> tuple[WorkClass, str | None]:
        if named is None:
            priority = head.get(b"x-priority")
            named = classes.resolve(None if priority is None else priority.decode())
        if tenant is None and b"x-tenant" in head:
            tenant = head[b"x-tenant"].decode()
        return named, tenant

    def release(self) -> None:
        self.released += 1


class Echo:
    """A protocol of its own: ``{"model": ..., "input": [...], "timeout": s}`` in, outputs out.

    The body names its model or leaves it to the path (``exchange.model``); ``priority``
    names a class of work.
    """

    protocol = "echo"
    body_types = frozenset({"application/json"})

    def __init__(self, *models: ServedModel) -> None:
        self.models = {m.name: m for m in models}
        self.parsed = 0

    def parse(self, exchange: Exchange, body: bytes) -> Parsed:
        self.parsed += 1
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise ApiError("malformed", f"the body is not valid JSON: {exc}") from None
        name = doc.get("model")
        model = exchange.model if name is None else self.models.get(name)
        if model is None:
            raise ApiError("not_found", f"model {name!r} is not served here", param="model")
        items = doc.get("input")
        if not items:
            raise ParseError(model, ApiError("empty", "input must not be empty", param="input"))
        priority = doc.get("priority")
        work_class = None
        if priority is not None and model.classes is not None:
            work_class = model.classes.resolve(priority)
        return Parsed(model, doc, items, doc.get("timeout"), work_class)

    def answer(self, exchange: Exchange, served: list[Served[Any]]) -> Reply:
        body = json.dumps({"outputs": [s.output for s in served]}).encode()
        return Reply(200, [(b"x-echo", b"yes")], body, head=timing_head(served))

    def error_body(self, error: ApiError) -> bytes:
        return json.dumps({"reason": error.reason, "message": error.message}).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """One input offered to the fake queue: what the exchange gave ``offer``."""

    item: Any
    deadline: float | None
    waiter: Any
    index: int
    work_class: str | None
    tenant: str | None


class FakeQueue:
    """What an exchange asks of a batcher, recorded; nothing runs.

    Args:
        refusal: ``screen``'s verdict on every head (None: admitted).
        room: inputs ``offer`` admits before it raises ``QueueFull`` (None: all).
    """

    def __init__(self, refusal: Rejected | None = None, room: int | None = None) -> None:
        self.refusal = refusal
        self.room = room
        self.screened: list[tuple[float | None, str | None, str | None]] = []
        self.offered: list[Offer] = []
        self.withdrawn: list[Offer] = []

    def screen(
        self, deadline: float | None, work_class: str | None = None, tenant: str | None = None
    ) -> Rejected | None:
        self.screened.append((deadline, work_class, tenant))
        return self.refusal

    def offer(
        self,
        item: Any,
        deadline: float | None,
        waiter: Any,
        index: int = 0,
        work_class: str | None = None,
        tenant: str | None = None,
    ) -> Offer:
        if self.room is not None and len(self.offered) >= self.room:
            raise QueueFull("queue is full: 1 items waiting, queue_size is 1", retry_after_s=0.25)
        entry = Offer(
            item=item,
            deadline=deadline,
            waiter=waiter,
            index=index,
            work_class=work_class,
            tenant=tenant,
        )
        self.offered.append(entry)
        return entry

    def withdraw(self, entry: Offer) -> None:
        self.withdrawn.append(entry)


class Bench:
    """One test's world: a clock, a host, a model ``m`` (30 s default deadline) and its queue."""

    def __init__(self, queue: FakeQueue | None = None, classes: ClassConfig | None = None) -> None:
        self.clock = ManualClock(T0)
        self.host = FakeHost(self.clock)
        self.model = ServedModel(
            ModelSettings(name="m", spec="m", classes=classes), clock=self.clock
        )
        self.queue = queue if queue is not None else FakeQueue()
        self.model.batcher = cast(Any, self.queue)
        self.endpoint = Echo(self.model)
        self.replies: list[Reply] = []

    def exchange(self, head: Head | None = None) -> Exchange:
        """A new exchange that arrived now, its replies going to ``self.replies``."""
        return Exchange(self.host, self.endpoint, head or {}, self.clock.now(), self.replies.append)

    def opened(self, verdict: HeadVerdict | None = None, head: Head | None = None) -> Exchange:
        """A new exchange, opened at once with ``verdict`` (default: its head names ``m``)."""
        exchange = self.exchange(head)
        exchange.open(verdict or HeadVerdict(self.model, True), self.clock.now())
        return exchange


def said(replies: Sequence[Reply]) -> list[tuple[int, list[tuple[bytes, bytes]], bytes, Any]]:
    """The replies as (status, every header pair, media type, body as JSON)."""
    return [(r.status, r.all_headers(), r.content_type, json.loads(r.body)) for r in replies]


def timing(ms: str) -> tuple[bytes, bytes]:
    return (b"server-timing", b"total;dur=" + ms.encode())


def served(output: Any, *, wait: float = 0.5, size: int = 2, batch_id: int = 7) -> Served[Any]:
    return Served(
        output=output, queue_wait_s=wait, forward_s=0.25, batch_size=size, batch_id=batch_id
    )


# -- a request answered ------------------------------------------------------------------


def test_a_request_is_screened_offered_and_answered_when_its_last_input_settles() -> None:
    b = Bench()
    exchange = b.opened()
    assert not exchange.done
    assert b.queue.screened == [(T0 + 30.0, None, None)]  # the model's default deadline
    b.clock.advance(0.125)
    exchange.feed(b'{"input": ["a", "bb"]}')
    assert [(o.item, o.deadline, o.waiter, o.index) for o in b.queue.offered] == [
        ("a", T0 + 30.0, exchange, 0),
        ("bb", T0 + 30.0, exchange, 1),
    ]
    b.clock.advance(0.125)
    exchange.settle(1, served(2, wait=0.125), None)
    assert b.replies == []  # one input still pending
    exchange.settle(0, served(1), None)
    assert said(b.replies) == [
        (
            200,
            [
                (b"x-echo", b"yes"),
                (b"x-queue-wait-s", b"0.500000,0.125000"),
                (b"x-batch-size", b"2,2"),
                (b"x-batch-id", b"7,7"),
                (b"x-forward-s", b"0.250000,0.250000"),
                timing("250.000"),
            ],
            JSON_TYPE,
            {"outputs": [1, 2]},
        )
    ]
    assert exchange.done
    assert b.host.metrics.seen == [("m", "echo", "ok", 0.25, None)]
    assert b.queue.withdrawn == []
    # Settled twice, released twice: one reply, one release.
    exchange.settle(0, served(1), None)
    exchange.release()
    exchange.release()
    assert len(b.replies) == 1
    assert b.host.released == 1


def test_one_input_answers_with_the_single_value_timing_lines() -> None:
    b = Bench()
    exchange = b.opened()
    exchange.feed(b'{"input": ["a"]}')
    exchange.settle(0, served("A", size=1, batch_id=0), None)
    assert b.replies[0].head == (
        b"x-queue-wait-s: 0.500000\r\nx-batch-size: 1\r\nx-batch-id: 0\r\n"
        b"x-forward-s: 0.250000\r\nserver-timing: total;dur=0.000\r\n"
    )


def test_a_model_named_by_the_body_is_screened_as_the_guess_and_stands_from_the_body() -> None:
    b = Bench()
    exchange = b.opened(HeadVerdict(b.model, False))
    assert b.queue.screened == [(T0 + 30.0, None, None)]
    assert exchange.model is None  # a guess screens the queue, the body names the model
    exchange.feed(b'{"model": "m", "input": ["a"]}')
    assert exchange.model is b.model
    exchange.settle(0, served("A"), None)
    assert [r.status for r in b.replies] == [200]
    assert b.host.metrics.seen == [("m", "echo", "ok", 0.0, None)]


def test_the_tighter_of_the_heads_deadline_and_the_bodys_stands() -> None:
    b = Bench()
    tight = b.opened(HeadVerdict(b.model, True, deadline=T0 + 1.0))
    tight.feed(b'{"input": ["a"], "timeout": 0.5}')
    loose = b.opened(HeadVerdict(b.model, True, deadline=T0 + 1.0))
    loose.feed(b'{"input": ["b"], "timeout": 2.0}')
    assert b.queue.screened == [(T0 + 1.0, None, None)] * 2
    assert [(o.item, o.deadline) for o in b.queue.offered] == [("a", T0 + 0.5), ("b", T0 + 1.0)]
    assert (tight.deadline, loose.deadline) == (T0 + 0.5, T0 + 1.0)


def test_a_class_of_work_and_a_tenant_reach_the_queue_with_the_classs_deadline() -> None:
    classes = ClassConfig(
        classes=(
            WorkClass(name="interactive", queue_share=0.5, timeout_s=0.5),
            WorkClass(name="bulk", queue_share=0.5, timeout_s=8.0),
        )
    )
    b = Bench(classes=classes)
    head = {b"x-priority": b"bulk", b"x-tenant": b"alice"}
    exchange = b.opened(head=head)
    assert b.queue.screened == [(T0 + 8.0, "bulk", "alice")]
    exchange.feed(b'{"input": ["a"]}')
    # A class the body names stands over the head's, and sets the deadline.
    named = b.opened(head=head)
    named.feed(b'{"input": ["b"], "priority": "interactive"}')
    assert [(o.item, o.deadline, o.work_class, o.tenant) for o in b.queue.offered] == [
        ("a", T0 + 8.0, "bulk", "alice"),
        ("b", T0 + 0.5, "interactive", "alice"),
    ]
    assert named.work_class is not None
    assert named.work_class.name == "interactive"


# -- bodies that break a rule ------------------------------------------------------------


def test_a_body_that_is_not_json_is_a_400_with_the_parsers_message_and_nothing_offered() -> None:
    b = Bench()
    exchange = b.opened(HeadVerdict(b.model, False))
    exchange.feed(b'{"input": ')
    assert said(b.replies) == [
        (
            400,
            [(b"x-reason", b"malformed"), timing("0.000")],
            JSON_TYPE,
            {
                "reason": "malformed",
                "message": "the body is not valid JSON: "
                "Expecting value: line 1 column 11 (char 10)",
            },
        )
    ]
    assert b.queue.offered == []
    # Found before the body named a model: counted against none.
    assert b.host.metrics.seen == [(None, "echo", "malformed", 0.0, None)]


def test_a_body_that_names_its_model_then_breaks_a_rule_is_counted_against_it() -> None:
    b = Bench()
    exchange = b.opened(HeadVerdict(b.model, False))
    exchange.feed(b'{"model": "m", "input": []}')
    assert said(b.replies) == [
        (
            400,
            [(b"x-reason", b"empty"), timing("0.000")],
            JSON_TYPE,
            {"reason": "empty", "message": "input must not be empty"},
        )
    ]
    assert b.host.metrics.seen == [("m", "echo", "empty", 0.0, None)]
    assert b.queue.offered == []


def test_a_body_naming_a_model_not_served_is_a_404() -> None:
    b = Bench()
    exchange = b.opened(HeadVerdict(b.model, False))
    exchange.feed(b'{"model": "other", "input": ["a"]}')
    assert [(r.status, json.loads(r.body)) for r in b.replies] == [
        (404, {"reason": "not_found", "message": "model 'other' is not served here"})
    ]


# -- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "headers"),
    [
        (
            ApiError("unauthorized", "an API key is required"),
            401,
            [(b"x-reason", b"unauthorized"), (b"www-authenticate", b"Bearer")],
        ),
        (
            ApiError("too_large", "Content-Length 9000000 is over max_body_bytes 8388608"),
            413,
            [(b"x-reason", b"too_large")],
        ),
        (
            ApiError("unsupported_media_type", "Content-Type text/csv is not read here"),
            415,
            [(b"x-reason", b"unsupported_media_type")],
        ),
    ],
)
def test_a_refusal_of_the_head_is_answered_at_once_and_its_body_never_parsed(
    error: ApiError, status: int, headers: list[tuple[bytes, bytes]]
) -> None:
    # An oversize body is refused here, from its declared length (App.verdict), unread.
    b = Bench()
    exchange = b.opened(HeadVerdict(b.model, True, refusal=error))
    assert exchange.done
    exchange.feed(b'{"input": ["a"]}')
    assert said(b.replies) == [
        (
            status,
            [*headers, timing("0.000")],
            JSON_TYPE,
            {"reason": error.reason, "message": error.message},
        )
    ]
    assert (b.endpoint.parsed, b.queue.screened, b.queue.offered) == (0, [], [])
    assert b.host.metrics.seen == [("m", "echo", error.reason, 0.0, None)]


@pytest.mark.parametrize(
    ("refusal", "status"),
    [
        (QueueFull("queue is full: 4 items waiting, queue_size is 4", retry_after_s=0.25), 429),
        (DeadlineInfeasible("the deadline cannot be met: 1.5s predicted", retry_after_s=1.5), 429),
        (ShuttingDown("the batcher is shutting down", retry_after_s=1.0), 503),
    ],
)
def test_the_queues_refusal_of_the_head_is_answered_before_the_body_is_read(
    refusal: Rejected, status: int
) -> None:
    b = Bench(FakeQueue(refusal))
    exchange = b.opened()
    assert exchange.done
    exchange.feed(b'{"input": ["a"]}')
    retry_s = str(max(1, -int(-refusal.retry_after_s // 1))).encode()
    retry_ms = str(round(refusal.retry_after_s * 1000)).encode()
    assert said(b.replies) == [
        (
            status,
            [
                (b"x-reason", refusal.reason.encode()),
                (b"retry-after", retry_s),
                (b"retry-after-ms", retry_ms),
                timing("0.000"),
            ],
            JSON_TYPE,
            {"reason": refusal.reason, "message": str(refusal)},
        )
    ]
    assert b.endpoint.parsed == 0
    assert b.queue.offered == []
    assert b.host.metrics.seen == [("m", "echo", refusal.reason, 0.0, None)]


def test_a_refusal_is_rendered_once_and_each_reply_gets_its_own_timing_line() -> None:
    b = Bench(FakeQueue(QueueFull("queue is full: 2 items waiting", retry_after_s=0.5)))
    b.opened()
    b.clock.advance(0.5)
    b.opened()
    first, second = b.replies
    assert first is not second
    assert first.body is second.body  # the cached body, not rebuilt under load
    assert first.head.endswith(b"server-timing: total;dur=0.000\r\n")
    assert second.head.endswith(b"server-timing: total;dur=0.000\r\n")
    assert first.head == second.head


def test_a_draining_server_refuses_a_new_request_with_503() -> None:
    b = Bench()
    b.host.draining = True
    exchange = b.opened()
    assert exchange.done
    assert said(b.replies) == [
        (
            503,
            [
                (b"x-reason", b"draining"),
                (b"retry-after", b"1"),
                (b"retry-after-ms", b"1000"),
                timing("0.000"),
            ],
            JSON_TYPE,
            {
                "reason": "draining",
                "message": "the server is shutting down and admits no new requests",
            },
        )
    ]
    assert b.queue.screened == []


def test_a_drain_begun_while_the_body_was_read_refuses_it_then() -> None:
    b = Bench()
    exchange = b.opened()
    b.host.draining = True
    b.clock.advance(0.25)
    exchange.feed(b'{"input": ["a"]}')
    assert [(r.status, json.loads(r.body)["reason"]) for r in b.replies] == [(503, "draining")]
    assert b.queue.offered == []
    assert b.host.metrics.seen == [("m", "echo", "draining", 0.25, None)]


def test_a_deadline_passed_before_the_head_was_read_is_a_504() -> None:
    b = Bench()
    exchange = b.exchange()
    b.clock.advance(0.25)
    exchange.open(HeadVerdict(b.model, True, deadline=T0 + 0.125), b.clock.now())
    assert said(b.replies) == [
        (
            504,
            [(b"x-reason", b"deadline_exceeded"), timing("250.000")],
            JSON_TYPE,
            {
                "reason": "deadline_exceeded",
                "message": "the request's deadline passed 0.2500s after it arrived, "
                "before it was admitted",
            },
        )
    ]
    assert b.queue.screened == []


def test_a_deadline_the_body_sets_that_has_passed_is_a_504_before_anything_is_offered() -> None:
    b = Bench()
    exchange = b.opened()
    b.clock.advance(0.5)
    exchange.feed(b'{"input": ["a"], "timeout": 0.25}')
    assert [(r.status, json.loads(r.body)["message"]) for r in b.replies] == [
        (504, "the request's deadline passed 0.5000s after it arrived, before it was admitted")
    ]
    assert b.queue.offered == []


def test_a_model_still_loading_is_a_503_not_ready() -> None:
    b = Bench()
    b.model.batcher = None
    b.clock.advance(0.5)
    b.opened()
    assert said(b.replies) == [
        (
            503,
            [
                (b"x-reason", b"not_ready"),
                (b"retry-after", b"1"),
                (b"retry-after-ms", b"1000"),
                timing("0.000"),
            ],
            JSON_TYPE,
            {"reason": "not_ready", "message": "model 'm' is loading (0.5s so far)"},
        )
    ]


def test_a_refusal_of_one_input_withdraws_those_already_offered() -> None:
    b = Bench(FakeQueue(room=1))
    exchange = b.opened()
    exchange.feed(b'{"input": ["a", "b", "c"]}')
    assert [o.item for o in b.queue.offered] == ["a"]
    assert b.queue.withdrawn == b.queue.offered
    assert [(r.status, r.head) for r in b.replies] == [
        (
            429,
            b"x-reason: queue_full\r\nretry-after: 1\r\nretry-after-ms: 250\r\n"
            b"server-timing: total;dur=0.000\r\n",
        )
    ]


# -- inputs that end badly ---------------------------------------------------------------


def test_an_input_the_model_failed_answers_with_its_error_and_withdraws_the_rest() -> None:
    b = Bench()
    exchange = b.opened()
    exchange.feed(b'{"input": ["a", "b", "c"]}')
    exchange.settle(0, served("A"), None)
    exchange.settle(1, None, ModelError("input 1: the model raised ValueError"))
    exchange.settle(2, served("C"), None)  # too late: the request has its answer
    assert said(b.replies) == [
        (
            422,
            [(b"x-reason", b"model_error"), timing("0.000")],
            JSON_TYPE,
            {"reason": "model_error", "message": "input 1: the model raised ValueError"},
        )
    ]
    assert b.queue.withdrawn == b.queue.offered
    assert b.host.metrics.seen == [("m", "echo", "model_error", 0.0, None)]


def test_an_answer_built_after_the_deadline_is_a_late_504_never_a_200() -> None:
    b = Bench()
    exchange = b.opened(HeadVerdict(b.model, True, deadline=T0 + 0.25))
    exchange.feed(b'{"input": ["a"]}')
    b.clock.advance(0.5)  # the pass ended in time, but the loop got the CPU late
    exchange.settle(0, served("A"), None)
    assert said(b.replies) == [
        (
            504,
            [(b"x-reason", b"deadline_exceeded"), timing("500.000")],
            JSON_TYPE,
            {
                "reason": "deadline_exceeded",
                "message": "deadline passed after 0.5000s, as its answer was built",
            },
        )
    ]
    assert b.host.metrics.seen == [("m", "echo", "deadline_exceeded", 0.5, "late")]


def test_an_endpoint_that_fails_to_build_its_answer_is_a_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b = Bench()
    exchange = b.opened()
    exchange.feed(b'{"input": ["a"]}')
    exchange.settle(0, served(object()), None)  # not JSON: json.dumps raises TypeError
    assert [(r.status, json.loads(r.body)) for r in b.replies] == [
        (500, {"reason": "internal", "message": "internal server error: TypeError"})
    ]
    assert "internal error on an inference request" in caplog.text


# -- a client that leaves ----------------------------------------------------------------


def test_a_client_that_leaves_gets_no_reply_and_its_inputs_are_withdrawn() -> None:
    b = Bench()
    exchange = b.opened()
    exchange.feed(b'{"input": ["a", "b"]}')
    b.clock.advance(0.25)
    exchange.abandon()
    assert exchange.done
    assert b.replies == []
    assert b.queue.withdrawn == b.queue.offered
    assert len(b.queue.offered) == 2
    assert b.host.metrics.seen == [("m", "echo", "cancelled", 0.25, None)]
    # What the batcher still sends, and a second leave, change nothing.
    exchange.settle(0, served("A"), None)
    exchange.abandon()
    exchange.fail(ModelError("too late"))
    exchange.release()
    assert (b.replies, len(b.host.metrics.seen), b.host.released) == ([], 1, 1)


def test_a_client_that_leaves_after_its_answer_changes_nothing() -> None:
    b = Bench()
    exchange = b.opened()
    exchange.feed(b'{"input": ["a"]}')
    exchange.settle(0, served("A"), None)
    exchange.abandon()
    assert [r.status for r in b.replies] == [200]
    assert b.queue.withdrawn == []
    assert [seen[2] for seen in b.host.metrics.seen] == ["ok"]


# -- with a real batcher -----------------------------------------------------------------


class Model:
    """An async model that upper-cases texts, recording every pass; held until ``go`` is set."""

    def __init__(self) -> None:
        self.passes: list[list[str]] = []
        self.go = asyncio.Event()
        self.go.set()

    async def __call__(self, texts: Sequence[Any]) -> list[str]:
        self.passes.append(list(texts))
        await self.go.wait()
        return [t.upper() for t in texts]


async def batched(model: Model, batch: BatchConfig) -> Bench:
    """A bench whose model ``m`` runs ``model`` behind a real batcher on the manual clock."""
    b = Bench()
    b.model.batcher = Batcher(model, batch, clock=b.clock)
    return b


async def until(done: Exchange) -> None:
    """Let the loop run the pass's task until ``done`` has its reply (a bounded poll)."""
    for _ in range(100):
        if done.done:
            return
        await asyncio.sleep(0)
    raise AssertionError("the exchange was never answered")


async def test_a_real_batcher_runs_the_inputs_in_one_pass_and_answers_them() -> None:
    model = Model()
    b = await batched(model, BatchConfig(max_batch_size=2, max_wait_s=1.0))
    exchange = b.opened()
    b.clock.advance(0.25)
    exchange.feed(b'{"input": ["a", "b"]}')  # a full batch: dispatched at once
    await until(exchange)
    assert model.passes == [["a", "b"]]
    assert said(b.replies) == [
        (
            200,
            [
                (b"x-echo", b"yes"),
                (b"x-queue-wait-s", b"0.000000,0.000000"),
                (b"x-batch-size", b"2,2"),
                (b"x-batch-id", b"0,0"),
                (b"x-forward-s", b"0.000000,0.000000"),
                timing("250.000"),
            ],
            JSON_TYPE,
            {"outputs": ["A", "B"]},
        )
    ]


async def test_a_client_that_leaves_before_its_pass_costs_no_model_time() -> None:
    model = Model()
    b = await batched(model, BatchConfig(max_batch_size=8, max_wait_s=0.5))
    left = b.opened()
    left.feed(b'{"input": ["gone", "also gone"]}')
    stays = b.opened()
    stays.feed(b'{"input": ["kept"]}')
    left.abandon()
    assert b.model.batcher is not None
    assert b.model.batcher.statistics().queue_depth == 1
    b.clock.advance(0.5)  # the wait is over: the pass forms from what is still queued
    await until(stays)
    assert model.passes == [["kept"]]
    assert [json.loads(r.body) for r in b.replies] == [{"outputs": ["KEPT"]}]
    counters = b.model.batcher.statistics().counters
    assert (counters.cancelled, counters.ok) == (2, 1)


async def test_a_client_that_leaves_during_its_pass_gets_nothing_and_the_pass_goes_on() -> None:
    model = Model()
    model.go.clear()
    b = await batched(model, BatchConfig(max_batch_size=2, max_wait_s=0.5))
    left = b.opened()
    left.feed(b'{"input": ["a"]}')
    stays = b.opened()
    stays.feed(b'{"input": ["b"]}')
    for _ in range(10):
        await asyncio.sleep(0)
    assert model.passes == [["a", "b"]]  # both inputs are in the running pass
    left.abandon()
    model.go.set()
    await until(stays)
    assert [json.loads(r.body) for r in b.replies] == [{"outputs": ["B"]}]
    assert [seen[2] for seen in b.host.metrics.seen] == ["cancelled", "ok"]


async def test_the_real_policys_refusal_is_answered_as_it_states_it() -> None:
    model = Model()
    b = await batched(model, BatchConfig(max_batch_size=8, max_wait_s=0.5, queue_size=1))
    b.opened().feed(b'{"input": ["a"]}')
    refused = b.opened()
    assert refused.done
    (reply,) = b.replies
    headers = dict(reply.all_headers())
    assert (reply.status, headers[b"x-reason"]) == (429, b"queue_full")
    assert int(headers[b"retry-after-ms"]) >= 1
    assert json.loads(reply.body) == {
        "reason": "queue_full",
        "message": "queue is full: 1 items waiting, queue_size is 1",
    }
    b.clock.advance(0.5)
    assert b.model.batcher is not None
    await b.model.batcher.shutdown()
    assert model.passes == [["a"]]
