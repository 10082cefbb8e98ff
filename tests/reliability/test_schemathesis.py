"""Scenario 7, generated: schemathesis against the server's own OpenAPI description.

The spec is the one the server serves at ``/openapi.json`` (the test checks it is the same
document); every operation in it gets a bounded number of generated requests, schema-valid
and not, sent to a real server in a subprocess. Each answer must not be a 5xx and must
match the spec: status, headers, content type and body schema. Hypothesis runs
derandomized with no example database, so every run sends the same requests.

One check is left out for one operation: that every schema-valid request is accepted, for
KServe ``infer``. A tensor's consistency (its data against its shape and datatype, its
inputs against the model's signature) is beyond what JSON Schema can say, so a generated
tensor is schema-valid yet almost never a tensor; the server rightly answers 422. The same
check is left out for the task routes of other kinds of model than this server's embedder
(rerank, predict, classify, embed_all) and for those that need a tokenizer it has not (tokenize,
decode): the document is the server's, not one model's, and a route asked of the wrong kind
of model answers 400 ``wrong_kind`` by contract, whatever the body.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import (
    NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES as NEGATIVE,
)
from schemathesis.config._checks import (
    NOT_A_SERVER_ERROR_EXPECTED_STATUSES as NOT_SERVER_ERROR,
)
from schemathesis.config._checks import (
    POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES as POSITIVE,
)
from schemathesis.specs.openapi.checks import positive_data_acceptance

from batchserve.server.ops.openapi import openapi_spec
from batchserve_testing.harness import FAULTY, Server, serve

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

MODELS = ["faulty"]
# What a server without --api-key serves, its one model making 4-dimensional embeddings.
SPEC = openapi_spec(MODELS, secured=False, dimensions=[4])
# 413 is a right answer to any request, valid or not, that is over a size limit of the
# deployment (body bytes, inputs, characters): the limits are settings, not schema. And 504
# is no server error: it is the documented answer to a request whose own deadline (say,
# ``X-Request-Timeout: .5ms``) passed before its pass ended; every other 5xx fails.
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "not_a_server_error": {"expected-statuses": [*NOT_SERVER_ERROR, "504"]},
            "negative_data_rejection": {"expected-statuses": [*NEGATIVE, "413"]},
            "positive_data_acceptance": {"expected-statuses": [*POSITIVE, "413"]},
        }
    }
)
schema = schemathesis.openapi.from_dict(SPEC, config=CONFIG)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    env = {"BATCHSERVE_FAULT_COST": "fixed=0ms,per_item=0ms,dim=4"}
    with serve(["--model", FAULTY, "--max-wait", "0ms", "--read-timeout", "2s"], env) as s:
        assert s.client.get("/openapi.json").json() == SPEC
        yield s


#: Task routes this server's one model (an embedder without a tokenizer) does not answer.
_OTHER_KINDS = {
    "/rerank",
    "/predict",
    "/v1/rerank",
    "/v2/rerank",
    "/classify",
    "/embed_all",
    "/tokenize",
    "/decode",
}


@schema.parametrize()
@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_endpoint_answers_within_its_contract(
    case: schemathesis.Case[Any], server: Server
) -> None:
    path = case.operation.path
    excluded: list[Any] = (
        [positive_data_acceptance] if path.endswith("/infer") or path in _OTHER_KINDS else []
    )
    case.call_and_validate(base_url=server.url, excluded_checks=excluded)
