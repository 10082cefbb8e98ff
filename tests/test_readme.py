"""The README's Python example runs as written; its quick start names scripts that exist."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_quick_start_is_two_commands_that_exist() -> None:
    block = README.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["scripts/serve", "scripts/test"]
    for c in commands:
        assert (ROOT / c).stat().st_mode & 0o111, f"{c} is not executable"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test" in ci


def test_python_example_runs() -> None:
    code = re.search(r"## In Python\s+```python\n(.*?)```", README, re.S)
    assert code is not None
    out = subprocess.run(
        [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "[[1.0], [2.0], [3.0]] {3: 1}" in out.stdout
