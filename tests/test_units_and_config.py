import math

import pytest

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import ConfigError
from batchserve.models import SyntheticModel
from batchserve.models.kinds import EMBEDDING, GENERIC
from batchserve.models.loader import load_model, parse_synthetic
from batchserve.units import format_duration, parse_duration, parse_rates


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2ms", 0.002), ("0.25s", 0.25), ("250us", 0.00025), ("1m", 60.0), ("1.5 s", 1.5)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2", "ms", "-1s", "2 parsecs", "inf"])
def test_parse_duration_rejects_with_the_rule(text: str) -> None:
    with pytest.raises(ConfigError, match="max_wait must be a duration with a unit"):
        parse_duration(text, name="max_wait")


def test_bare_number_with_default_unit() -> None:
    assert parse_duration("0.5", default_unit="s") == 0.5


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 0.0005, 0.002, 1.5)] == ["0s", "500us", "2ms", "1.5s"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be >= 1, got 0"),
        ({"max_batch_size": 2.5}, "max_batch_size must be an integer, got 2.5"),
        ({"max_wait_s": -0.001}, "max_wait_s must be >= 0, got -0.001"),
        ({"max_wait_s": math.nan}, "max_wait_s must be finite"),
        ({"queue_size": 0}, "queue_size must be >= 1, got 0"),
        ({"workers": True}, "workers must be an integer, got True"),
        ({"admission": "yes"}, "admission must be a bool"),
        ({"prefetch": "yes"}, "prefetch must be a bool"),
        ({"max_bisect_calls": -1}, "max_bisect_calls must be >= 0, got -1"),
    ],
)
def test_config_errors_name_field_rule_and_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        BatchConfig(**kwargs)  # type: ignore[arg-type]


def test_cost_estimate() -> None:
    assert CostEstimate(fixed_s=0.008, per_item_s=0.00025).cost(32) == pytest.approx(0.016)
    with pytest.raises(ConfigError, match="per_item_s must be >= 0"):
        CostEstimate(fixed_s=0.0, per_item_s=-1.0)


def test_synthetic_model_answers_as_the_seed() -> None:
    m = SyntheticModel(0.0, 0.0)
    assert m(["a", "b"]) == ["embedding(a)", "embedding(b)"]
    v = SyntheticModel(0.0, 0.0, dimension=4)(["a"])[0]
    assert isinstance(v, list)
    assert len(v) == 4
    assert sum(x * x for x in v) == pytest.approx(1.0)


def test_synthetic_spec() -> None:
    m = parse_synthetic("synthetic:fixed=20ms,per_item=2ms,dim=0")
    assert (m.fixed_s, m.per_item_s, m.dimension) == (0.02, 0.002, None)
    with pytest.raises(ConfigError, match="unknown synthetic model option 'speed'"):
        parse_synthetic("synthetic:speed=1")


def test_load_model_specs() -> None:
    assert load_model("synthetic").kind is EMBEDDING
    assert load_model("batchserve.models.synthetic:SyntheticModel").kind is GENERIC
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        load_model("no_such_module:fn")
    with pytest.raises(ConfigError, match="model spec must be"):
        load_model("nonsense")


def test_rates_are_a_number_a_list_or_an_inclusive_range() -> None:
    assert parse_rates("600") == [600.0]
    assert parse_rates("200, 400") == [200.0, 400.0]
    assert parse_rates("200:1000:400") == [200.0, 600.0, 1000.0]
    for bad in ("", "0", "-5", "abc", "inf", "1:2", "5:1:1", "1:5:0"):
        with pytest.raises(ConfigError, match="--sweep must be a rate > 0"):
            parse_rates(bad, name="--sweep")


def test_int_range_is_n_or_low_high() -> None:
    from batchserve.units import parse_int_range

    assert parse_int_range("12") == (12, 12)
    assert parse_int_range("3:200") == (3, 200)
    for bad in ("0", "5:1", "a", "3:x"):
        with pytest.raises(ConfigError, match="--tokens must be"):
            parse_int_range(bad, name="--tokens")
