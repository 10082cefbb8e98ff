"""Classes of work and tenants in the pure policy, driven with plain numbers."""

import math

import pytest

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import ConfigError, DeadlineInfeasible, QueueFull
from batchserve.policy import ClassConfig, Policy, Tenant, WorkClass
from batchserve.policy.classes import parse_class

INTERACTIVE = WorkClass(name="interactive", weight=1.0, queue_share=0.25, timeout_s=0.1)
BULK = WorkClass(name="bulk", weight=1.0, queue_share=0.75, timeout_s=30.0, max_wait_s=0.02)
CLASSES = ClassConfig(classes=(INTERACTIVE, BULK))


def make(classes: ClassConfig = CLASSES, **kw: object) -> Policy[str]:
    return Policy(BatchConfig(**kw), classes=classes)  # type: ignore[arg-type]


def names(batch: object) -> list[str]:
    return [e.payload for e in batch.entries]  # type: ignore[attr-defined]


def test_config_errors_name_the_field_and_the_rule() -> None:
    with pytest.raises(ConfigError, match=r"class bulk queue_share must be in \(0, 1\], got 2"):
        WorkClass(name="bulk", queue_share=2)
    with pytest.raises(ConfigError, match="class x weight must be > 0, got 0"):
        WorkClass(name="x", weight=0)
    with pytest.raises(ConfigError, match="class names must be unique"):
        ClassConfig(classes=(BULK, BULK))
    with pytest.raises(ConfigError, match="default class must be one of"):
        ClassConfig(classes=(BULK,), default="nope")
    with pytest.raises(ConfigError, match="tenant_share must be > 0, got 0"):
        ClassConfig(classes=(BULK,), tenant_share=0)


def test_resolve_takes_a_name_a_level_or_nothing() -> None:
    assert CLASSES.resolve("bulk") is BULK
    assert CLASSES.resolve("1") is INTERACTIVE
    assert CLASSES.resolve(2) is BULK
    assert CLASSES.resolve(0) is BULK  # the default: the last, least urgent class
    assert CLASSES.resolve(None) is BULK
    with pytest.raises(ConfigError, match="must be one of interactive, bulk or a level 0-2"):
        CLASSES.resolve("urgent")
    with pytest.raises(ConfigError, match=r"level must be 0 \(default\) to 2, got 3"):
        CLASSES.resolve(3)
    with pytest.raises(ConfigError, match="class must be one of interactive, bulk"):
        make().offer(0.0, "x", None, work_class="urgent")


def test_interactive_never_waits_behind_a_full_bulk_queue() -> None:
    p = make(max_batch_size=4, max_wait_s=0.002, queue_size=40, admission=False)
    for i in range(30):
        p.offer(0.0, f"b{i}", None, work_class="bulk")
    # The bulk class is at its share (40 * 0.75): more bulk is refused, a query is not.
    with pytest.raises(QueueFull, match="class bulk is full: 30 items waiting"):
        p.offer(0.0, "b-more", None, work_class="bulk")
    first = p.poll(0.0).dispatch[0]
    assert names(first) == ["b0", "b1", "b2", "b3"]
    p.offer(0.001, "q", None, work_class="interactive")
    p.finish(0.010, first)
    # The query rides the very next pass, ahead of 26 queued bulk items.
    second = p.poll(0.010).dispatch[0]
    assert names(second)[0] == "q"
    assert len(second) == 4


def test_a_reserved_worker_waits_free_for_queries_which_ride_passes_of_their_own() -> None:
    quick = WorkClass(name="interactive", queue_share=0.25, reserve=1)
    classes = ClassConfig(classes=(quick, BULK))
    p = make(classes, max_batch_size=4, max_wait_s=0.002, workers=2, admission=False)
    for i in range(12):
        p.offer(0.0, f"b{i}", None, work_class="bulk")
    # Bulk takes one worker and leaves the other free, however much bulk waits.
    first = p.poll(0.0).dispatch
    assert [names(b) for b in first] == [["b0", "b1", "b2", "b3"]]
    assert p.poll(1.0).dispatch == []
    # A query goes at once on the kept worker, alone: no bulk item rides with it.
    p.offer(1.0, "q1", None, work_class="interactive")
    p.offer(1.0, "q2", None, work_class="interactive")
    (queries,) = p.poll(1.002).dispatch
    assert names(queries) == ["q1", "q2"]
    # With both workers busy, the next query waits for whichever frees first; the bulk
    # pass ending first hands its worker to bulk only while no query is queued.
    p.offer(1.003, "q3", None, work_class="interactive")
    p.finish(1.004, first[0])
    (after,) = p.poll(1.005).dispatch
    assert names(after) == ["q3"]
    p.finish(1.006, queries)
    (bulk,) = p.poll(1.006).dispatch
    assert names(bulk) == ["b4", "b5", "b6", "b7"]
    assert p.poll(1.1).dispatch == []  # q3's pass holds the kept worker's place


def test_reserves_that_leave_no_worker_or_are_not_whole_are_refused() -> None:
    quick = WorkClass(name="interactive", reserve=2)
    with pytest.raises(
        ConfigError,
        match=r"class reserves \(interactive reserve=2\) must "
        r"leave a worker for the other classes: workers is 2",
    ):
        make(ClassConfig(classes=(quick, BULK)), workers=2)
    with pytest.raises(ConfigError, match="class q reserve must be a whole number of workers"):
        WorkClass(name="q", reserve=-1)
    with pytest.raises(ConfigError, match="class q reserve must be a whole number of workers"):
        parse_class("q:reserve=half")
    assert parse_class("q:share=0.25,reserve=1").reserve == 1


def test_a_many_input_request_is_spread_over_passes_beside_queries() -> None:
    p = make(max_batch_size=8, max_wait_s=0.002, admission=False)
    for i in range(64):  # one bulk request of 64 inputs
        p.offer(0.0, f"b{i}", None, work_class="bulk")
    running = p.poll(0.0).dispatch[0]
    passes = [names(running)]
    for t in range(1, 9):
        now = t * 0.01
        p.offer(now - 0.005, f"q{t}", None, work_class="interactive")
        p.finish(now, running)
        running = p.poll(now).dispatch[0]
        passes.append(names(running))
    # Every pass after the first carries the query that arrived during the one before.
    for t in range(1, 9):
        assert passes[t][0] == f"q{t}"
        assert len(passes[t]) == 8
    assert sum(1 for ps in passes for x in ps if x.startswith("b")) == 8 + 8 * 7


def test_weighted_shares_split_a_pass_and_carry_the_fraction() -> None:
    classes = ClassConfig(
        classes=(WorkClass(name="a", weight=1.0), WorkClass(name="b", weight=2.0)),
    )
    p = make(classes, max_batch_size=4, max_wait_s=0.0, queue_size=100, admission=False)
    for i in range(40):
        p.offer(0.0, f"a{i}", None, work_class="a")
        p.offer(0.0, f"b{i}", None, work_class="b")
    counts = {"a": 0, "b": 0}
    now = 0.0
    for _ in range(15):
        batch = p.poll(now).dispatch[0]
        for x in names(batch):
            counts[x[0]] += 1
        now += 0.01
        p.finish(now, batch)
    # 60 items at weights 1:2, to within one item.
    assert abs(counts["a"] - 20) <= 1
    assert abs(counts["b"] - 40) <= 1


def test_tenants_share_a_class_by_deficit_round_robin_with_weights() -> None:
    classes = ClassConfig(
        classes=(WorkClass(name="bulk"),),
        tenants=(Tenant(name="alice", weight=1.0), Tenant(name="bob", weight=3.0)),
        tenant_share=0.5,
    )
    p = make(classes, max_batch_size=6, max_wait_s=0.0, queue_size=1000, admission=False)
    for i in range(400):
        p.offer(0.0, f"a{i}", None, tenant="alice")
    for i in range(400):
        p.offer(0.0, f"b{i}", None, tenant="bob")
    got = {"a": 0, "b": 0}
    now = 0.0
    for _ in range(40):
        batch = p.poll(now).dispatch[0]
        for x in names(batch):
            got[x[0]] += 1
        now += 0.01
        p.finish(now, batch)
    assert got == {"a": 60, "b": 180}
    # Within a tenant, arrival order is kept.
    stats = p.class_statistics()["bulk"]
    assert stats["alice"].ok == 60
    assert stats["bob"].ok == 180


def test_a_flooding_tenant_is_bounded_by_its_share_and_others_still_get_in() -> None:
    classes = ClassConfig(classes=(WorkClass(name="bulk"),), tenant_share=0.5)
    p = make(classes, max_batch_size=4, max_wait_s=1.0, queue_size=10, admission=False)
    for i in range(5):
        p.offer(0.0, f"f{i}", None, tenant="flood")
    with pytest.raises(QueueFull, match=r"tenant flood is at its share of class bulk: 5 items"):
        p.offer(0.0, "f5", None, tenant="flood")
    for i in range(5):
        p.offer(0.0, f"o{i}", None, tenant="other")
    counters = p.class_statistics()["bulk"][""]
    assert counters.rejected["queue_full"] == 1
    assert counters.received == 11
    assert counters.pending == 10
    # Requests with no tenant are not bounded by the tenant share, only by the class.
    q = make(classes, max_batch_size=4, max_wait_s=1.0, queue_size=10, admission=False)
    for i in range(10):
        q.offer(0.0, f"n{i}", None)


def test_admission_judges_a_query_by_its_own_lane_not_by_the_bulk_queue() -> None:
    cost = CostEstimate(fixed_s=0.010, per_item_s=0.001)
    p = make(max_batch_size=8, max_wait_s=0.001, queue_size=1000, initial_cost=cost)
    for i in range(200):
        p.offer(0.0, f"b{i}", 30.0, work_class="bulk")
    running = p.poll(0.0).dispatch[0]
    # FIFO would put a query behind 192 bulk items (24 passes of 18 ms: 0.43 s).
    fifo: Policy[str] = Policy(BatchConfig(max_batch_size=8, queue_size=1000, initial_cost=cost))
    for i in range(200):
        fifo.offer(0.0, f"b{i}", 30.0)
    fifo.poll(0.0)
    with pytest.raises(DeadlineInfeasible):
        fifo.offer(0.001, "q", 0.101)
    # Here it waits for the running pass and rides the next one: 2 * 18 ms.
    assert p.offer(0.001, "q", 0.101, work_class="interactive").payload == "q"
    p.finish(0.018, running)
    assert names(p.poll(0.018).dispatch[0])[0] == "q"


def test_retry_after_is_the_time_for_the_refused_lane_to_move() -> None:
    cost = CostEstimate(fixed_s=0.010, per_item_s=0.001)
    classes = ClassConfig(
        classes=(WorkClass(name="hi", queue_share=0.5), WorkClass(name="lo", weight=0.25)),
    )
    p = make(classes, max_batch_size=8, max_wait_s=0.001, queue_size=16, initial_cost=cost)
    for i in range(8):
        p.offer(0.0, f"h{i}", None, work_class="hi")
    for i in range(8):
        p.offer(0.0, f"l{i}", None, work_class="lo")
    with pytest.raises(QueueFull) as hi:
        p.offer(0.0, "h", None, work_class="hi")
    with pytest.raises(QueueFull) as lo:
        p.offer(0.0, "l", None, work_class="lo")
    pass_s = 0.010 + 8 * 0.001
    # "hi" gets 6.4 of every 8 slots, so one pass frees room; "lo" gets 1.6: one pass too.
    assert hi.value.retry_after_s == pytest.approx(pass_s)
    assert lo.value.retry_after_s == pytest.approx(pass_s)
    many = ClassConfig(classes=(WorkClass(name="bulk"),), tenant_share=0.1)
    q = make(many, max_batch_size=2, max_wait_s=0.001, queue_size=40, initial_cost=cost)
    for t in range(8):
        for i in range(4):
            q.offer(0.0, f"{t}.{i}", None, tenant=f"t{t}")
    with pytest.raises(QueueFull) as crowded:
        q.offer(0.0, "x", None, tenant="t0")
    # Eight tenants share passes of 2 items: a tenant waits 4 passes for a slot.
    assert crowded.value.retry_after_s == pytest.approx(4 * (0.010 + 2 * 0.001))


def test_each_class_waits_its_own_max_wait() -> None:
    p = make(max_batch_size=8, max_wait_s=0.002, admission=False)
    p.offer(0.0, "b", None, work_class="bulk")
    step = p.poll(0.0)
    assert step.dispatch == []
    assert step.wake_at == pytest.approx(0.02)  # bulk waits up to 20 ms to fill a pass
    p.offer(0.005, "q", None, work_class="interactive")
    assert p.poll(0.005).wake_at == pytest.approx(0.007)
    assert names(p.poll(0.007).dispatch[0]) == ["q", "b"]


def test_outcomes_add_up_per_class_including_expiry_and_cancel() -> None:
    p = make(max_batch_size=2, max_wait_s=0.0, queue_size=10, admission=False)
    p.offer(0.0, "a", 1.0, work_class="bulk")
    p.offer(0.0, "b", 0.5, work_class="bulk")
    c = p.offer(0.0, "c", 0.05, work_class="interactive")
    d = p.offer(0.0, "d", None, work_class="interactive")
    batch = p.poll(0.0).dispatch[0]
    assert names(batch) == ["c", "a"]
    assert p.cancel(0.01, d)
    step = p.poll(0.6)
    assert [e.payload for e in step.expired] == ["b"]
    assert step.late == [c]  # answered at its deadline, during the pass
    p.finish(0.7, batch)
    s = p.class_statistics()
    assert s["interactive"][""].ok == 0
    assert s["interactive"][""].late == 1
    assert s["interactive"][""].cancelled == 1
    assert s["bulk"][""].ok == 1
    assert s["bulk"][""].expired == 1
    for per_tenant in s.values():
        for t in per_tenant.values():
            assert t.received == t.resolved + t.pending
    total = p.statistics().counters
    assert total.received == total.resolved == 4


def test_one_class_with_no_tenants_forms_the_batches_of_the_plain_policy() -> None:
    one = ClassConfig(classes=(WorkClass(name="all"),))
    cfg = BatchConfig(max_batch_size=3, max_wait_s=0.004, admission=False)
    mixed: Policy[int] = Policy(cfg, classes=one)
    plain: Policy[int] = Policy(cfg)
    got: dict[str, list[list[int]]] = {"mixed": [], "plain": []}
    for name, p in (("mixed", mixed), ("plain", plain)):
        running = []
        for i in range(20):
            now = i * 0.0015
            p.offer(now, i, now + 0.02)
            step = p.poll(now)
            running.extend(step.dispatch)
            got[name].extend([e.payload for e in b.entries] for b in step.dispatch)
            if running and i % 3 == 0:
                p.finish(now, running.pop(0))
    assert got["mixed"] == got["plain"]


def test_a_pass_is_cut_short_for_the_tightest_deadline_it_holds() -> None:
    cost = CostEstimate(fixed_s=0.010, per_item_s=0.001)
    p = make(max_batch_size=64, max_wait_s=0.001, queue_size=1000, initial_cost=cost)
    for i in range(200):
        p.offer(0.0, f"b{i}", 30.0, work_class="bulk")
    running = p.poll(0.0).dispatch[0]
    assert len(running) == 64
    # A full pass of 64 would end 74 ms after the running one (at 0.148): too late for a
    # query due at 0.120; it is admitted, for a pass cut to what fits by then.
    p.offer(0.050, "q", 0.120, work_class="interactive")
    p.finish(0.074, running)
    cut = p.poll(0.074).dispatch[0]
    assert names(cut)[0] == "q"
    est, spread = p.cost_model.estimate, p.cost_model.spread_s
    fits = math.floor((0.120 - 0.074 - est.fixed_s - 2 * spread) / est.per_item_s)
    assert 1 < len(cut) == fits < 64
    assert 0.074 + est.cost(len(cut)) <= 0.120
    # Without a tight deadline the next pass is full again.
    p.finish(0.115, cut)
    assert len(p.poll(0.115).dispatch[0]) == 64


def test_a_prefetched_entry_that_expires_is_expired_in_its_lane_as_in_the_policy() -> None:
    # This policy does not prefetch; forced here, the lanes must still count as it does.
    p = make(max_batch_size=1, max_wait_s=0.0, admission=False)
    p._prefetch = True
    p.offer(0.0, "running", 1.0, work_class="bulk")
    p.offer(0.0, "waiting", 0.005, work_class="bulk")
    first, second = p.poll(0.0).dispatch
    assert [e.payload for e in p.poll(0.005).expired] == ["waiting"]
    p.finish(0.010, first)
    p.finish(0.010, second, skipped=second.entries)
    own = p.statistics().counters
    lane = p.class_statistics()["bulk"][""]
    assert (own.ok, own.expired, own.cancelled, own.pending) == (1, 1, 0, 0)
    assert (lane.ok, lane.expired, lane.cancelled, lane.pending) == (1, 1, 0, 0)


def test_the_lanes_add_up_to_the_policy_after_a_pass_with_every_outcome() -> None:
    p = make(max_batch_size=4, max_wait_s=0.0, admission=False)
    for x, cls in [("ok", "bulk"), ("late", "interactive"), ("bad", "bulk"), ("gone", "bulk")]:
        p.offer(0.0, x, 0.05 if x == "late" else 1.0, work_class=cls)
    (batch,) = p.poll(0.0).dispatch
    by_name = {e.payload: e for e in batch.entries}
    p.finish(0.06, batch, failed=[by_name["bad"]], skipped=[by_name["gone"]])
    own = p.statistics().counters
    bulk = p.class_statistics()["bulk"][""]
    interactive = p.class_statistics()["interactive"][""]
    assert (own.ok, own.late, own.failed, own.cancelled, own.pending) == (1, 1, 1, 1, 0)
    assert (bulk.ok, bulk.late, bulk.failed, bulk.cancelled, bulk.pending) == (1, 0, 1, 1, 0)
    assert (interactive.late, interactive.pending) == (1, 0)
