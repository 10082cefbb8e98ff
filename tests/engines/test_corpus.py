import statistics

from batchserve.engines.corpus import SPEED_REQUESTS, digest, reference_paragraphs, speed_texts
from batchserve.loadgen.texts import reference_paragraphs as from_loadgen


def test_the_reference_manual_gives_many_paragraphs_of_a_long_tailed_mix() -> None:
    paragraphs = reference_paragraphs()
    assert len(paragraphs) >= 1200
    assert len(set(paragraphs)) == len(paragraphs)
    lengths = sorted(len(p) for p in paragraphs)
    mean, median = statistics.mean(lengths), statistics.median(lengths)
    # A long tail: the mean well above the median, the longest many times the mean.
    assert 120 < mean < 400
    assert median < mean
    assert lengths[-1] > 8 * mean


def test_paragraphs_are_single_spaced_text_without_headings() -> None:
    for p in reference_paragraphs():
        assert p == " ".join(p.split())
        assert not set(p) <= set("*=-~^ ")
    assert 'The "if" statement is used for conditional execution:' in reference_paragraphs()


def test_the_order_is_fixed_and_the_loaders_agree() -> None:
    assert reference_paragraphs() is from_loadgen()
    assert len(digest()) == 16
    assert digest() == digest()


def test_speed_texts_are_requests_of_real_text_of_mixed_lengths() -> None:
    batches = speed_texts(batch_size=32, workers=2)
    assert [len(b) for b in batches] == [32] * 2 * SPEED_REQUESTS
    assert batches == speed_texts(batch_size=32, workers=2)  # the same every time
    flat = [t for b in batches for t in b]
    assert len(set(flat)) == len(flat)
    assert set(flat) <= set(reference_paragraphs())
    # Mixed as an indexer's requests are: each holds short and long paragraphs, so the
    # engines' sub-passes show in their times.
    for b in batches:
        lengths = sorted(len(t) for t in b)
        assert lengths[-1] > 2.5 * lengths[len(b) // 2] > 10 * lengths[0]
    assert len(speed_texts(batch_size=4, workers=1, requests=3)) == 3
