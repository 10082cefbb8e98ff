"""Mixed traffic from the generator: each stream's class and tenant on the wire, one row each."""

import json

import pytest

from batchserve.loadgen.config import LoadConfig
from batchserve.loadgen.protocol import encode_request
from batchserve.loadgen.runner import run_mix
from loadgen_server import Reply, TinyServer


def test_priority_and_tenant_travel_in_headers_and_kserve_parameters() -> None:
    cfg = LoadConfig(url="http://127.0.0.1:1", priority="interactive", tenant="alice")
    head, _, body = encode_request(cfg, ["x"]).partition(b"\r\n\r\n")
    assert b"\r\nX-Priority: interactive" in head
    assert b"\r\nX-Tenant: alice" in head
    kserve = LoadConfig(url="http://127.0.0.1:1", api="kserve", priority="1", timeout_s=0.1)
    _, _, body = encode_request(kserve, ["x"]).partition(b"\r\n\r\n")
    assert json.loads(body)["parameters"] == {"timeout": 100000, "priority": 1}
    with pytest.raises(ValueError, match="priority must be a printable name without commas"):
        LoadConfig(url="http://127.0.0.1:1", priority="a,b")


@pytest.mark.slow
def test_streams_start_together_and_are_reported_apart() -> None:
    with TinyServer(lambda s: Reply(delay_s=0.005)) as srv:
        runs = run_mix(
            [
                LoadConfig(url=srv.url, rate=100, duration_s=0.5, priority="interactive"),
                LoadConfig(
                    url=srv.url,
                    rate=20,
                    duration_s=0.5,
                    inputs_per_request=4,
                    priority="bulk",
                    tenant="b",
                ),
            ]
        )
    q, b = (r.report for r in runs)
    assert (q.summary.sent, q.summary.ok, q.priority, q.tenant) == (50, 50, "interactive", None)
    assert (b.summary.sent, b.summary.ok, b.priority, b.tenant) == (10, 10, "bulk", "b")
    classes = [s.headers.get("x-priority") for s in srv.seen]
    assert classes.count("interactive") == 50
    assert classes.count("bulk") == 10
    assert {
        s.headers.get("x-tenant") for s in srv.seen if s.headers.get("x-priority") == "bulk"
    } == {"b"}
    # One start for both streams, and each stream's first request reached the server soon
    # after it (both are due at the start; 250 ms allows for a busy machine).
    assert runs[0].start_at == runs[1].start_at
    for name in ("interactive", "bulk"):
        first = min(s.arrived for s in srv.seen if s.headers.get("x-priority") == name)
        assert 0.0 <= first - runs[0].start_at < 0.25, name
