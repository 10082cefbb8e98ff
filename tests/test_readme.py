"""The README's front page works as written.

Its quick start is two scripts that exist, its ``curl`` gets an embedding from a server
serving the model it names (in-process, a synthetic stand-in under the built-in model's
name), its Python example runs and prints what it says. Its other shell commands are
parsed against the CLI in ``tests/test_docs.py``, and its headline table is compared there
with its result file.
"""

import pathlib
import re
import shlex
import subprocess
import sys

import httpx

from batchserve.server import App, ModelSettings, ServerSettings

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_front_page_stays_a_front_page() -> None:
    assert len(README.splitlines()) <= 220
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README.split("<!-- results: compare -->")[0])


def test_quick_start_is_two_commands_that_exist() -> None:
    block = README.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["scripts/serve", "scripts/test"]
    for c in commands:
        assert (ROOT / c).stat().st_mode & 0o111, f"{c} is not executable"
    # CI runs them in this order: serve to ready, one request to the curl's route, stop;
    # then the tests
    ci = "\n".join(
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line.startswith("#")
    )
    marks = (
        "\nscripts/serve ",
        "batchserve ready",
        "/v1/embeddings",
        "\nkill -TERM",
        "\nscripts/test",
    )
    steps = [ci.index(m) for m in marks]
    assert steps == sorted(steps), steps


async def test_the_curl_gets_an_embedding() -> None:
    block = README.split("## Quick start", 1)[1].split("```sh", 2)[2].split("```", 1)[0]
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:2] == ["curl", "-s"]
    url = httpx.URL(argv[2])
    headers = dict(argv[i + 1].split(": ", 1) for i, a in enumerate(argv) if a == "-H")
    body = argv[argv.index("-d") + 1]
    model = re.search(r'"model": "([^"]+)"', body)
    assert model is not None
    served = ModelSettings(name=model.group(1), spec="synthetic:fixed=0ms,per_item=0ms,dim=384")
    app = App(ServerSettings(models=(served,), port=url.port or 80))
    await app.start()
    try:
        await app.wait_ready()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=f"{url.scheme}://{url.host}"
        ) as c:
            answer = await c.post(url.path, headers=headers, content=body)
    finally:
        await app.stop()
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["data"][0]["embedding"]) == 384
    assert answer.headers["x-batch-size"] == "1"


def test_python_example_runs() -> None:
    code = re.search(r"## In Python\s+```python\n(.*?)```", README, re.S)
    assert code is not None
    out = subprocess.run(
        [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "[[1.0], [2.0], [3.0]] {3: 1}" in out.stdout
    assert "[[1.0], [2.0], [3.0]] {3: 1}" in README  # what the README says it prints
