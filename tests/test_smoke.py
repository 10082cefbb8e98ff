import pytest

from batchserve.cli import main


def test_cli_help_exits_zero() -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
