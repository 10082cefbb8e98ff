"""Classes of work with passes formed by tokens: the two parameters of one policy, together."""

from batchserve.config import BatchConfig
from batchserve.policy import Batch, ClassConfig, Policy, WorkClass
from batchserve.subpasses import PassCost, plan, predict_s, shape

#: A CPU's shape: a sub-pass's fixed cost is worth 25 tokens; attention shows on long texts.
CPU = PassCost(fixed_s=0.010, per_token_s=0.0004, attention_s=0.4e-6)
#: A GPU's shape: a sub-pass's fixed cost is worth thousands of tokens.
GPU = PassCost(fixed_s=0.004, per_token_s=0.5e-6)
CLASSES = ClassConfig(classes=(WorkClass(name="interactive"), WorkClass(name="bulk")))


def pass_cost(batch: Batch[str], cost: PassCost) -> float:
    sizes = [e.size for e in batch.entries]
    return predict_s(shape(sizes, plan(sizes, cost)), cost)


def trained(cost: PassCost, **kw: object) -> tuple[Policy[str], float]:
    """A policy with classes, by tokens, whose token model has learned ``cost``."""
    config = BatchConfig(max_batch_size=4, max_wait_s=0.002, **kw)  # type: ignore[arg-type]
    p: Policy[str] = Policy(config, classes=CLASSES, by_tokens=True)
    now = 0.0
    for size in (10, 100, 40, 200, 20, 150):
        p.offer(now, "warm", None, size, work_class="bulk")
        (batch,) = p.poll(now + 0.002).dispatch
        now += 0.002 + pass_cost(batch, cost)
        p.finish(now, batch)
    return p, now


def run(p: Policy[str], now: float, cost: PassCost) -> list[list[str]]:
    """Every pass until the queue is empty, each by its items' names."""
    passes = []
    while p.queue_depth:
        (batch,) = p.poll(now + 0.002).dispatch
        passes.append([e.payload for e in batch.entries])
        now += 0.002 + pass_cost(batch, cost)
        p.finish(now, batch)
    return passes


def test_each_class_gives_a_pass_its_first_item_and_the_rest_join_by_tokens() -> None:
    p, now = trained(CPU)
    for name, size in (("b10", 10), ("b200", 200), ("b12", 12)):
        p.offer(now, name, None, size, work_class="bulk")
    p.offer(now, "q11", None, 11, work_class="interactive")
    # The query and the oldest bulk text share a sub-pass; 200 tokens beside them would
    # cost more than a sub-pass of its own, so that text waits for the next pass, and the
    # one behind it, of their length, joins (as in one FIFO queue by tokens).
    assert run(p, now, CPU) == [["q11", "b10", "b12"], ["b200"]]
    tokens = p.statistics().tokens
    assert tokens is not None
    assert tokens.queued == 0
    bulk = p.class_statistics()["bulk"][""]
    assert (bulk.ok, bulk.pending) == (9, 0)  # 6 to train it, then 3


def test_on_a_gpu_everything_joins_as_by_count() -> None:
    by_tokens, now = trained(GPU)
    by_count: Policy[str] = Policy(by_tokens.config, classes=CLASSES)
    for p in (by_tokens, by_count):
        for i, size in enumerate((10, 200, 12, 190, 11)):
            p.offer(now, f"b{i}", None, size, work_class="bulk")
        p.offer(now, "q", None, 5, work_class="interactive")
    assert run(by_tokens, now, GPU) == run(by_count, now, GPU)


def test_max_batch_tokens_bounds_what_joins_but_not_a_class_s_first_item() -> None:
    p, now = trained(GPU, max_batch_tokens=100)
    for name, size in (("b60", 60), ("b30", 30), ("b50", 50)):
        p.offer(now, name, None, size, work_class="bulk")
    p.offer(now, "q60", None, 60, work_class="interactive")
    # Each class's first item rides (2 x 60 padded > 100, as the oldest of a FIFO pass goes
    # whatever its tokens); nothing else fits beside them.
    assert run(p, now, GPU) == [["q60", "b60"], ["b30", "b50"]]


def test_the_queue_full_by_tokens_dispatches_before_the_max_wait() -> None:
    p, now = trained(GPU, max_batch_tokens=100)
    p.offer(now, "a", None, 60, work_class="bulk")
    assert p.poll(now).dispatch == []
    p.offer(now, "b", None, 60, work_class="interactive")
    (batch,) = p.poll(now).dispatch
    assert [e.payload for e in batch.entries] == ["b", "a"]
