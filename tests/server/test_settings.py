"""The server's settings: each rule checked where the settings are made."""

from __future__ import annotations

import pytest

from batchserve.errors import ConfigError
from batchserve.server import ServerSettings


def test_a_certificate_needs_its_key_and_ports_their_range() -> None:
    with pytest.raises(ConfigError, match="ssl_certfile and ssl_keyfile go together"):
        ServerSettings(ssl_certfile="cert.pem")
    with pytest.raises(ConfigError, match="ssl_ca_certs needs ssl_certfile and ssl_keyfile"):
        ServerSettings(ssl_ca_certs="ca.pem")
    with pytest.raises(ConfigError, match=r"grpc_port must be in 0\.\.65535, got 70000"):
        ServerSettings(grpc_port=70000)
    settings = ServerSettings.from_toml(None, overrides={"grpc_port": "8001"})
    assert settings.grpc_port == 8001
    settings = ServerSettings.from_toml(None, overrides={"grpc_max_calls": "100"})
    assert settings.grpc_max_calls == 100
    with pytest.raises(ConfigError, match="grpc_max_calls must be an integer >= 1, got 0"):
        ServerSettings(grpc_max_calls=0)
