"""The one table from an outcome's reason to its statuses: HTTP's and gRPC's."""

from __future__ import annotations

import grpc

from batchserve.server.statuses import GRPC_TABLE, STATUS_TABLE


def test_every_reason_has_one_grpc_code() -> None:
    assert set(GRPC_TABLE) == set(STATUS_TABLE)
    for reason, code in GRPC_TABLE.items():
        assert grpc.StatusCode[code] is not grpc.StatusCode.OK, reason
    assert GRPC_TABLE["queue_full"] == GRPC_TABLE["infeasible"] == "RESOURCE_EXHAUSTED"
    assert GRPC_TABLE["draining"] == GRPC_TABLE["not_ready"] == "UNAVAILABLE"
