"""``batchserve load grpc://``: the load generator over gRPC against a real server."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import server_process


@pytest.mark.slow
def test_the_load_generator_speaks_grpc_and_reads_the_trailing_facts() -> None:
    # `batchserve load grpc://...`: the open-loop schedule, the outcomes and the timing
    # facts (batch ids, the server's own time, refusal reasons) read from trailing metadata.
    from batchserve.loadgen import LoadConfig, run_load
    from batchserve.loadgen.protocol import Outcome

    args = ["--model", "m=synthetic:fixed=40ms", "--grpc-port", "0", "--max-batch-size", "4"]
    with server_process([*args, "--queue-size", "4"]) as server:
        url = f"grpc://{server.grpc}"
        texts = tuple(f"t{i}" for i in range(64))
        ok = run_load(LoadConfig(url=url, api="kserve", model="m", rate=40, duration_s=0.5))
        over = run_load(
            LoadConfig(url=url, api="kserve", model="m", rate=400, duration_s=0.5, texts=texts)
        )
        missing = run_load(LoadConfig(url=url, api="kserve", model="x", rate=20, duration_s=0.2))
        prometheus = httpx.get(server.url + "/metrics", timeout=5).text
        server.stop()
    r = ok.report.summary
    assert (r.sent, r.ok) == (20, 20)
    assert ok.report.items == 20
    assert 1 <= ok.report.batches <= 20
    assert all(0 < s < 1 for s in ok.records.server_s)
    # 200 requests at 10x what 40 ms passes of 4 serve: the queue of 4 refuses most, and
    # every refusal names its reason and carries the server's own (short) time.
    outcomes = over.records.outcomes()
    refused = [i for i, o in enumerate(outcomes) if o is Outcome.REJECTED]
    assert len(refused) > 100
    assert {over.records.status[i] for i in refused} == {429}
    assert {over.records.reason[i] for i in refused} <= {"queue_full", "infeasible"}
    assert all(over.records.server_s[i] < 0.1 for i in refused)
    assert outcomes.count(Outcome.OK) + len(refused) + outcomes.count(Outcome.TIMED_OUT) == 200
    # The server counted what the generator sent, over gRPC.
    assert 'protocol="grpc"' in prometheus
    assert set(missing.records.status) == {404}
    assert set(missing.records.reason) == {"not_found"}
