"""Hypothesis: the policy's invariants hold for any sequence of events, by count or by tokens."""

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from policy_script import Offer, Script, configs, events, timeouts, times

from batchserve.config import BatchConfig
from batchserve.errors import Rejected
from batchserve.policy import Entry, Policy

scripts = events(st.builds(Offer, times, timeouts, st.integers(1, 300)), max_size=120)
# Passes by tokens: None (by count), or (max_batch_tokens or None, length_window).
by_tokens = st.one_of(
    st.none(), st.tuples(st.one_of(st.none(), st.integers(50, 600)), st.integers(1, 3))
)


@settings(max_examples=300, deadline=None)
@given(configs(max_queue=12), scripts, st.booleans(), by_tokens, st.booleans())
def test_invariants(
    config: BatchConfig,
    script: list[object],
    close_at_end: bool,
    tokens: tuple[int | None, int] | None,
    screen_heads: bool,
) -> None:
    p: Policy[int]
    if tokens is None:
        p = Policy(config)
    else:
        config = replace(config, max_batch_tokens=tokens[0], length_window=tokens[1])
        p = Policy(config, by_tokens=True)
    limit = config.max_batch_tokens
    run = Script(p)
    dispatched: set[int] = set()
    rejected = 0

    wake = math.inf  # when the driver's timer would poll next
    offered = False  # the last event was an offer

    def step() -> None:
        nonlocal wake, offered
        now = run.now
        skip = offered and now < wake and not p.poll_due(now, wake)
        offered = False
        depth = p.queue_depth
        s = p.poll(now)
        if skip:
            # The driver skips this poll after an offer: it must have had nothing to do
            # before the timer it has.
            assert not s.expired
            assert not s.dispatch
            assert not s.late
            assert s.wake_at is None or s.wake_at >= wake
        wake = math.inf if s.wake_at is None else s.wake_at
        for e in s.expired:
            assert e.id not in run.outcomes
            assert e.deadline is not None
            assert e.deadline <= now
            run.outcomes[e.id] = "expired"
        for b in s.dispatch:
            assert 1 <= len(b.entries) <= config.max_batch_size
            if len(run.running) >= config.workers:
                # Every worker busy: only a batch that can no longer grow is prefetched: a
                # full one; by tokens, one chosen from a full window of the oldest items.
                assert config.prefetch, "no dispatch while every worker is busy"
                settled = config.max_batch_size * (1 if tokens is None else config.length_window)
                assert depth >= settled or p.draining, "only a settled batch is prefetched"
                if tokens is None:
                    assert len(b.entries) == config.max_batch_size or p.draining
            depth -= len(b.entries)
            ids = [e.id for e in b.entries]
            assert ids == sorted(ids), "queue order within a batch"
            if limit is not None and len(b.entries) > 1:
                padded = max(e.size for e in b.entries) * len(b.entries)
                assert padded <= limit, "a pass of several items within max_batch_tokens"
            for e in b.entries:
                assert e.id not in dispatched, "dispatched once"
                assert e.deadline is None or e.deadline > now, "never after its deadline"
                dispatched.add(e.id)
            run.running.append(b)
        assert len(run.running) <= config.workers * (2 if config.prefetch else 1)
        if s.wake_at is not None:
            assert s.wake_at >= now

    def step_and_count() -> None:
        step()
        stats = p.statistics()
        c = stats.counters
        assert c.received == c.resolved + c.pending
        assert c.rejected_total == rejected
        if stats.tokens is not None:
            assert stats.tokens.queued == sum(e.size for e in p.queued())
            assert stats.tokens.padded >= stats.tokens.real

    def offer(ev: Offer) -> Entry[int] | None:
        nonlocal rejected, offered
        offered = True
        deadline = None if ev.timeout is None else run.now + ev.timeout
        fresh = None
        if screen_heads:
            # As the server does: its head screened when it came (half the gap earlier),
            # its body offered now. An offer that reuses the screen's verdict must agree
            # with a prediction made afresh.
            if p.screen(run.now - ev.dt / 2, deadline) is not None:
                rejected += 1
                return None
            fresh = p._discipline.refusal(run.now, deadline, None, None, False)
        try:
            entry = p.offer(run.now, len(run.admitted), deadline, ev.size)
        except Rejected:
            rejected += 1
            return None
        assert fresh is None, "an offer admitted what a fresh prediction refuses"
        return entry

    run.play(script, offer, step_and_count)
    run.drain(step, close=close_at_end)
    c = p.statistics().counters
    assert c.pending == 0
    assert c.received == c.resolved == len(run.admitted) + rejected
