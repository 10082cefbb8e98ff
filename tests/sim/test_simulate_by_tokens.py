"""The simulator with passes formed by tokens, on a padded model's cost (MiniLM's on this CPU).

The cost is about what all-MiniLM-L6-v2 costs on one thread of a 2-core machine: 10 ms per
pass plus 0.37 ms per padded token (a pass pads every text to its longest; measured in
process at 13 ms for one 8-token text and 0.36-0.42 ms per padded token from 8 to 200
tokens; one served run of ``bench/peers/token_batching.py`` fitted 17 ms + 0.31 ms). Texts of 5 to
202 tokens, uniformly, past saturation with a 1 s deadline.
"""

import random

import pytest

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import ConfigError
from batchserve.sim import simulate
from batchserve.workload.arrivals import arrival_times

FIXED = CostEstimate(fixed_s=0.010, per_item_s=0.0)
PER_TOKEN_S = 0.00037
ARRIVALS = arrival_times(rate=40, duration_s=60, arrivals="poisson", seed=1)


def sizes(lo: int, hi: int) -> list[int]:
    rng = random.Random(2)
    return [2 + rng.randint(lo, hi) for _ in ARRIVALS]


def ok_per_s(config: BatchConfig, lengths: list[int]) -> tuple[float, int, int]:
    r = simulate(
        config=config,
        cost=FIXED,
        arrivals=ARRIVALS,
        timeout_s=1.0,
        sizes=lengths,
        per_token_s=PER_TOKEN_S,
    )
    s = r.summary
    return s.ok_per_s, s.timed_out, s.ok + s.timed_out


def test_passes_by_tokens_serve_more_of_a_mixed_length_load_than_any_count() -> None:
    mixed = sizes(3, 200)
    tokens, timed_out, admitted = ok_per_s(BatchConfig(max_batch_size=16), mixed)
    by_count = {
        b: ok_per_s(BatchConfig(max_batch_size=b, batch_by="count"), mixed)[0]
        for b in (1, 2, 4, 8, 16)
    }
    assert tokens >= 1.3 * by_count[16], "the same settings, by count"
    assert tokens >= max(by_count.values()), "the best batch size by count"
    assert timed_out <= 0.01 * admitted


def test_no_loss_on_uniform_short_texts() -> None:
    short = sizes(8, 12)
    for b in (8, 32):
        tokens = ok_per_s(BatchConfig(max_batch_size=b), short)[0]
        count = ok_per_s(BatchConfig(max_batch_size=b, batch_by="count"), short)[0]
        assert tokens >= 0.98 * count


def test_the_padding_waste_is_reported() -> None:
    r = simulate(
        config=BatchConfig(max_batch_size=16),
        cost=FIXED,
        arrivals=ARRIVALS[:200],
        timeout_s=1.0,
        sizes=sizes(3, 200)[:200],
        per_token_s=PER_TOKEN_S,
    )
    assert r.stats.tokens is not None
    assert 1.0 <= r.to_dict()["padding_waste"] == r.stats.tokens.waste < 1.3


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"sizes": [1, 2]}, r"sizes must hold one size per arrival \(3\), got 2"),
        ({"sizes": [1, 0, 2]}, r"sizes\[1\] must be an integer >= 1, got 0"),
        ({"per_token_s": 0.001}, "per_token_s needs sizes"),
        ({"sizes": [1, 1, 1], "per_token_s": -1.0}, "per_token_s must be >= 0"),
    ],
)
def test_bad_sizes_are_named(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate(config=BatchConfig(), cost=FIXED, arrivals=[0.0, 0.1, 0.2], **kw)  # type: ignore[arg-type]


def test_batch_by_tokens_needs_sizes() -> None:
    with pytest.raises(ConfigError, match="counts its inputs' tokens"):
        simulate(config=BatchConfig(batch_by="tokens"), cost=FIXED, arrivals=[0.0])
