"""The fence around uvicorn: every private name of its httptools protocol that batchserve
overrides, reads or copies, checked against the uvicorn installed.

``transport/guard.py`` and ``transport/httptools.py`` subclass uvicorn's
``HttpToolsProtocol``, one of uvicorn's most often changed files, and copy parts of its
methods. pyproject.toml bounds the version; these tests say, by name, what broke the day a
new uvicorn moves one of them.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import pathlib
import re
import tomllib
from importlib.metadata import version

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http import flow_control, httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from batchserve.server.transport.guard import GuardedHttpToolsProtocol
from batchserve.server.transport.httptools import ExchangeProtocol

ROOT = pathlib.Path(__file__).resolve().parents[3]

#: Methods of ``HttpToolsProtocol`` that the two classes override, each with the digest of
#: uvicorn's source it was read against: those that copy part of it (connection_made,
#: on_message_begin, on_header, on_response_complete, timeout_keep_alive_handler...) must be
#: read again when it changes.
OVERRIDDEN = {
    "connection_made": "6efb565ff3d36b91",
    "connection_lost": "c91a4c9bf2e29c55",
    "data_received": "010a7ae59a5d3b1a",
    "on_message_begin": "96d377fdc7c2baef",
    "on_url": "37be44e962b04ca8",
    "on_header": "65d62c044f61fdbd",
    "on_headers_complete": "1ea8589acfad92d8",
    "on_body": "dba9c32aeba35b6a",
    "on_message_complete": "1fbad42dc31fc01f",
    "on_response_complete": "64e254f28e389e76",
    "timeout_keep_alive_handler": "8b53bf5f2e202970",
    "_unset_keepalive_if_required": "00a6a4e47214e68e",
    "send_400_response": "ae5a4a3782b646fd",
    "_start_asgi_task": "9c08c2571ae9b038",
    "shutdown": "d7351fa33f00d430",
}

#: Attributes of a protocol instance that the two classes read or set (``url`` is set by
#: on_message_begin, whose digest is above).
INSTANCE_ATTRIBUTES = {
    "client",
    "connections",
    "cycle",
    "expect_100_continue",
    "flow",
    "headers",
    "loop",
    "parser",
    "pipeline",
    "scheme",
    "scope",
    "server",
    "server_state",
    "timeout_keep_alive",
    "timeout_keep_alive_task",
    "transport",
}


def _digest(name: str) -> str:
    source = inspect.getsource(getattr(HttpToolsProtocol, name))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def test_the_installed_uvicorn_is_within_the_bound() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [d for d in project["dependencies"] if d.startswith("uvicorn")]
    match = re.fullmatch(r"uvicorn\[standard\]>=([\d.]+),<([\d.]+)", spec)
    assert match, f"uvicorn's requirement needs an upper bound, got {spec!r}"
    installed = tuple(int(x) for x in version("uvicorn").split(".")[:2])
    low, high = (tuple(int(x) for x in v.split(".")[:2]) for v in match.groups())
    assert low <= installed < high, (version("uvicorn"), spec)


def test_every_override_is_listed() -> None:
    ours = {
        name
        for cls in (GuardedHttpToolsProtocol, ExchangeProtocol)
        for name in vars(cls)
        if hasattr(HttpToolsProtocol, name) and not name.startswith("__")
    }
    assert ours == set(OVERRIDDEN), ours ^ set(OVERRIDDEN)


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_uvicorn_s_method_is_the_one_it_was_read_against(name: str) -> None:
    assert callable(getattr(HttpToolsProtocol, name, None)), (
        f"uvicorn's HttpToolsProtocol has no {name} any more: "
        "batchserve/server/transport/{guard,httptools}.py override it"
    )
    assert _digest(name) == OVERRIDDEN[name], (
        f"uvicorn's HttpToolsProtocol.{name} changed (uvicorn {version('uvicorn')}): read it "
        "against batchserve's override in server/transport/{guard,httptools}.py, port the "
        "change, then update its digest here and the bound in pyproject.toml"
    )


async def test_every_instance_attribute_read_exists() -> None:
    protocol = HttpToolsProtocol(
        config=Config(app=lambda *a: None, http="httptools"),
        server_state=ServerState(),
        app_state={},
        _loop=asyncio.get_running_loop(),
    )
    missing = {name for name in INSTANCE_ATTRIBUTES if not hasattr(protocol, name)}
    assert not missing, f"uvicorn's HttpToolsProtocol no longer sets {sorted(missing)}"


def test_every_module_level_name_read_exists() -> None:
    assert httptools_impl.STATUS_LINE[200].startswith(b"HTTP/1.1 200 ")
    for name in ("get_local_addr", "get_remote_addr", "is_ssl"):
        assert callable(getattr(httptools_impl, name, None)), f"uvicorn moved {name}"
    for name in ("read_paused", "pause_reading", "resume_reading"):
        assert name in inspect.getsource(flow_control.FlowControl), f"FlowControl.{name}"
    assert "response_complete" in inspect.getsource(RequestResponseCycle.__init__)
    state = ServerState()
    assert hasattr(state, "default_headers")
    assert hasattr(state, "total_requests")
