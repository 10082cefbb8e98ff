import asyncio
from collections.abc import Sequence

import pytest

from batchserve.decorator import batched
from batchserve.errors import ConfigError


async def test_function_calls_are_batched() -> None:
    seen: list[list[int]] = []

    @batched(max_batch_size=8, max_wait_s=0.02)
    def double(xs: Sequence[int]) -> list[int]:
        seen.append(list(xs))
        return [2 * x for x in xs]

    async def main() -> list[int]:
        out = await asyncio.gather(*(double(i) for i in range(5)))
        assert double.statistics().counters.ok == 5
        await double.aclose()
        return list(out)

    assert await main() == [0, 2, 4, 6, 8]
    assert seen == [[0, 1, 2, 3, 4]]


async def test_methods_get_one_batcher_per_instance() -> None:
    class Model:
        def __init__(self, k: int) -> None:
            self.k = k
            self.calls = 0

        @batched(max_batch_size=4, max_wait_s=0.01)
        async def __call__(self, xs: Sequence[int]) -> list[int]:
            self.calls += 1
            return [self.k * x for x in xs]

    async def main() -> tuple[list[int], list[int]]:
        a, b = Model(10), Model(100)
        ra = await asyncio.gather(*(a(i) for i in range(3)))
        rb = await asyncio.gather(*(b(i) for i in range(3)))
        assert (a.calls, b.calls) == (1, 1)
        return list(ra), list(rb)

    assert await main() == ([0, 10, 20], [0, 100, 200])


def test_bad_settings_fail_at_decoration() -> None:
    with pytest.raises(ConfigError, match="max_batch_size must be >= 1, got 0"):
        batched(max_batch_size=0)
