"""The Batcher with a model that counts tokens: each item is sized, passes form by tokens."""

from collections.abc import Sequence

import pytest

from batchserve.batcher import Batcher
from batchserve.clock import ManualClock
from batchserve.config import BatchConfig
from batchserve.errors import ConfigError
from batchserve.policy import ClassConfig, WorkClass
from support import settle


class Padded:
    """An async model whose pass costs its longest text times its count, in virtual time."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.calls: list[list[str]] = []

    def token_estimate(self, text: str) -> int:
        return len(text)

    async def __call__(self, xs: Sequence[str]) -> list[int]:
        self.calls.append(list(xs))
        await self.clock.sleep(0.001 * max(map(len, xs)) * len(xs))
        return [len(x) for x in xs]


async def test_a_model_that_counts_tokens_gets_passes_formed_by_tokens() -> None:
    clock = ManualClock()
    model = Padded(clock)
    config = BatchConfig(max_batch_size=2, max_wait_s=0.002, max_batch_tokens=40)
    b: Batcher[int] = Batcher(model, config, clock=clock)
    texts = ["a" * 30, "b" * 5, "c" * 28, "d" * 6]
    tickets = [b.submit_nowait(t) for t in texts]
    for _ in range(4):
        clock.advance(0.1)
        await settle()
    assert [(await t).output for t in tickets] == [30, 5, 28, 6]
    # The oldest (30) goes first; 30 + 28 would pad 60 > 40 tokens, so it runs alone.
    assert model.calls[0] == ["a" * 30]
    stats = b.statistics()
    assert stats.tokens is not None
    assert stats.tokens.real == 69
    assert stats.tokens.padded >= stats.tokens.real


async def test_batch_by_count_ignores_the_models_token_counts() -> None:
    clock = ManualClock()
    b: Batcher[int] = Batcher(Padded(clock), BatchConfig(batch_by="count"), clock=clock)
    assert b.statistics().tokens is None


async def test_a_sizer_sizes_the_inputs_of_a_model_without_token_counts() -> None:
    async def model(xs: Sequence[str]) -> list[int]:
        return [0 for _ in xs]

    b: Batcher[int] = Batcher(model, BatchConfig(batch_by="tokens"), sizer=len)
    assert (await b.submit("abc")) == 0
    stats = b.statistics()
    assert stats.tokens is not None
    assert stats.tokens.real == 3
    with pytest.raises(ConfigError, match="counts its inputs' tokens"):
        Batcher(model, BatchConfig(batch_by="tokens"))


async def test_classes_of_work_form_their_passes_by_tokens() -> None:
    clock = ManualClock()
    model = Padded(clock)
    classes = ClassConfig(classes=(WorkClass(name="interactive"), WorkClass(name="bulk")))
    config = BatchConfig(max_batch_size=2, max_wait_s=0.002, max_batch_tokens=40)
    b: Batcher[int] = Batcher(model, config, clock=clock, classes=classes)
    assert b.batch_by == "tokens"
    bulk = [b.submit_nowait("b" * n, priority="bulk") for n in (30, 28)]
    query = b.submit_nowait("q" * 5, priority="interactive")
    for _ in range(4):
        clock.advance(0.1)
        await settle()
    assert [(await t).output for t in [*bulk, query]] == [30, 28, 5]
    # Two bulk texts fill a pass by count, but 30 + 28 would pad 60 > 40 tokens: the oldest
    # runs alone. The query then rides the next pass, first, beside the other bulk text
    # (each class gives a pass its first item).
    assert model.calls == [["b" * 30], ["q" * 5, "b" * 28]]
    stats = b.statistics()
    assert stats.tokens is not None
    assert stats.tokens.real == 63
    assert b.class_statistics()["bulk"][""].ok == 2
    with pytest.raises(ConfigError, match="counts its inputs' tokens"):
        Batcher(lambda xs: xs, BatchConfig(batch_by="tokens"), classes=classes)
    assert Batcher(lambda xs: xs, BatchConfig(), classes=classes).batch_by == "count"
