"""The schedule is fixed in advance by the config and dealt exactly among processes."""

from batchserve.loadgen.config import LoadConfig
from batchserve.loadgen.runner import split
from batchserve.loadgen.texts import generate_texts
from batchserve.workload.arrivals import arrival_times


def test_the_schedule_is_the_seeded_arrival_process_exactly() -> None:
    cfg = LoadConfig(url="http://h", rate=200, duration_s=2, arrivals="poisson", seed=7)
    schedule = cfg.schedule()
    assert schedule == arrival_times(rate=200, duration_s=2, arrivals="poisson", seed=7)
    assert schedule == cfg.schedule()
    assert (
        schedule
        != LoadConfig(url="http://h", rate=200, duration_s=2, arrivals="poisson", seed=8).schedule()
    )
    assert schedule == sorted(schedule)
    assert all(0 <= t < 2 for t in schedule)


def test_constant_arrivals_are_evenly_spaced() -> None:
    cfg = LoadConfig(url="http://h", rate=4, duration_s=1)
    assert cfg.schedule() == [0.0, 0.25, 0.5, 0.75]


def test_shares_deal_the_schedule_round_robin_and_add_up_to_it() -> None:
    cfg = LoadConfig(url="http://h", rate=100, duration_s=1, processes=3, max_connections=30)
    schedule = cfg.schedule()
    shares = split(cfg, schedule)
    assert [s.indices[:3] for s in shares] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert all(s.max_connections == 10 for s in shares)
    merged = sorted((i, t) for s in shares for i, t in zip(s.indices, s.offsets, strict=True))
    assert merged == list(enumerate(schedule))


def test_generated_texts_are_fixed_by_their_arguments() -> None:
    texts = generate_texts(5, words=7, seed=1)
    assert texts == generate_texts(5, words=7, seed=1)
    assert texts != generate_texts(5, words=7, seed=2)
    assert all(len(t.split()) == 7 for t in texts)
