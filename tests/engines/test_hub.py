"""A model by its Hub id: resolved through a huggingface_hub cache the tests build by hand.

Nothing here reaches the network: the cache is a temporary ``HF_HUB_CACHE`` laid out as
huggingface_hub lays it out (``models--org--name/snapshots/<commit>/`` and
``refs/<branch>``), the files symlinked as its blobs are; the downloading path runs against
stand-ins for ``HfApi.list_repo_files`` and ``snapshot_download``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchserve.cli import build_parser
from batchserve.cli.serve import build_settings
from batchserve.engines import hub
from batchserve.engines.loader import load_model, model_folder
from batchserve.errors import ConfigError
from batchserve.models.kinds import RERANKER
from batchserve.models.loader import default_model_name, is_hub_id, needs_engine, split_runtime

huggingface_hub = pytest.importorskip("huggingface_hub")

COMMIT = "a" * 40
OTHER = "b" * 40


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty huggingface_hub cache, named by ``HF_HUB_CACHE``."""
    path = tmp_path / "hub"
    path.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    return path


def snapshot(
    cache: Path, repo: str, files: dict[str, str | Path], commit: str = COMMIT, refs: Any = ()
) -> Path:
    """A snapshot of ``repo`` at ``commit`` holding ``files`` (text, or a file to link)."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    folder = storage / "snapshots" / commit
    for name, content in files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            target.symlink_to(content)
        else:
            target.write_text(content)
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (storage / "refs" / ref).write_text(commit)
    return folder


def test_a_hub_id_is_org_slash_name_and_not_a_folder_here(tmp_path: Path) -> None:
    assert is_hub_id("BAAI/bge-small-en-v1.5")
    assert needs_engine("BAAI/bge-small-en-v1.5:revision=main,backend=torch")
    assert split_runtime("BAAI/bge-small-en-v1.5:revision=v1.0") == (
        "BAAI/bge-small-en-v1.5",
        {"revision": "v1.0"},
    )
    assert default_model_name("BAAI/bge-small-en-v1.5:revision=v1.0") == "bge-small-en-v1.5"
    for spec in ("minilm", "bge", "a/b/c", "/abs/path", "./rel/x", "org/na--me", "pkg.mod:fn"):
        assert not is_hub_id(spec), spec
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not is_hub_id(str(tmp_path / "org" / "name"))


def test_the_cache_is_found_as_huggingface_hub_finds_it() -> None:
    assert hub.hub_cache({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}) == Path("/c")
    assert hub.hub_cache({"HF_HOME": "/h"}) == Path("/h/hub")
    assert hub.hub_cache({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")


def test_a_branch_a_tag_or_a_commit_names_a_cached_snapshot(cache: Path) -> None:
    main = snapshot(cache, "org/model", {"config.json": "{}"}, refs=["main", "v1.0"])
    old = snapshot(cache, "org/model", {"config.json": "{}"}, commit=OTHER)
    assert hub.resolve("org/model") == main
    assert hub.resolve("org/model", "v1.0") == main
    assert hub.resolve("org/model", OTHER) == old
    assert model_folder("org/model", "main") == main


def test_what_is_not_cached_offline_names_the_id_the_revision_the_cache_and_what_to_do(
    cache: Path,
) -> None:
    snapshot(cache, "org/model", {"config.json": "{}"}, refs=["main"])
    with pytest.raises(ConfigError) as info:
        hub.resolve("org/model", "v2")
    message = str(info.value)
    assert message.startswith(
        f"model 'org/model' at revision 'v2' is not in the Hugging Face cache {cache} "
    )
    assert "HF_HUB_OFFLINE=1 forbids downloading it" in message
    assert f"hf download org/model --revision v2, with HF_HUB_CACHE={cache}" in message
    with pytest.raises(ConfigError, match="model 'org/other' at revision 'main' is not in"):
        load_model("org/other:backend=torch")


def test_a_revision_names_only_a_hub_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a Hub id"):
        model_folder(str(tmp_path), "main")
    with pytest.raises(ConfigError, match="no model folder"):
        model_folder(str(tmp_path / "nope"))


def test_a_cached_model_loads_and_is_judged_like_any_folder(
    cache: Path, reranker_folder: Path
) -> None:
    files: dict[str, str | Path] = {p.name: p for p in reranker_folder.iterdir() if p.is_file()}
    snapshot(cache, "org/tiny-reranker", files, refs=["main"])
    loaded = load_model("org/tiny-reranker:backend=torch,threads=1")
    assert (loaded.kind, loaded.labels) == (RERANKER, ("LABEL_0",))
    assert np.asarray(loaded.fn([("q", "a passage")])).shape == (1, 1)
    snapshot(
        cache, "org/mlm", {"config.json": '{"architectures": ["BertForMaskedLM"]}'}, refs=["main"]
    )
    with pytest.raises(ConfigError) as info:
        load_model("org/mlm:backend=torch")
    assert str(info.value).startswith(f"org/mlm ({cache}")
    assert "a masked-language-model head" in str(info.value)
    code = '{"architectures": ["XModel"], "auto_map": {"AutoModel": "modeling_x.XModel"}}'
    snapshot(cache, "org/code", {"config.json": code}, refs=["main"])
    with pytest.raises(ConfigError, match="pass --trust-remote-code"):
        load_model("org/code:backend=torch")
    with pytest.raises(ConfigError, match="engines do not run a folder's own code yet"):
        load_model("org/code:backend=torch,trust_remote_code=on")


def test_the_files_never_read_are_left_out_of_a_download() -> None:
    files = [
        "config.json",
        "model.safetensors",
        "pytorch_model.bin",
        "2_Dense/pytorch_model.bin",
        "onnx/model.onnx",
        "tf_model.h5",
    ]
    patterns = hub.ignored(files)
    assert patterns[: len(hub.NEVER_READ)] == list(hub.NEVER_READ)
    # A .bin beside a .safetensors is left out; one alone (2_Dense's) is the weights.
    assert patterns[len(hub.NEVER_READ) :] == ["pytorch_model.bin"]


def _online(monkeypatch: pytest.MonkeyPatch, list_files: Callable[..., list[str]]) -> list[Any]:
    # The Hub as stand-ins: HfApi.list_repo_files, and a snapshot_download that records its
    # arguments and "downloads" into the cache.
    calls: list[Any] = []

    def download(repo_id: str, **kw: Any) -> str:
        calls.append((repo_id, kw))
        return str(snapshot(Path(kw["cache_dir"]), repo_id, {"config.json": "{}"}, refs=["main"]))

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(
        huggingface_hub.HfApi, "list_repo_files", lambda self, *a, **k: list_files()
    )
    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    return calls


def _http_error(kind: Any) -> Exception:
    import httpx2

    response = httpx2.Response(404, request=httpx2.Request("GET", "https://huggingface.co/x"))
    error: Exception = kind("not there", response=response)
    return error


def test_where_the_network_allows_the_snapshot_is_downloaded_into_the_cache(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _online(monkeypatch, lambda: ["config.json", "model.safetensors", "pytorch_model.bin"])
    folder = hub.resolve("org/model", "v1.0")
    assert folder == cache / "models--org--model" / "snapshots" / COMMIT
    ((repo, kw),) = calls
    assert (repo, kw["revision"], kw["cache_dir"]) == ("org/model", "v1.0", cache)
    assert kw["ignore_patterns"][-1] == "pytorch_model.bin"


@pytest.mark.parametrize(
    ("error", "words"),
    [
        ("RepositoryNotFoundError", "no model 'org/model' on the Hugging Face Hub"),
        ("GatedRepoError", "is gated on the Hugging Face Hub: accept its terms"),
        ("RevisionNotFoundError", "has no revision 'v9' on the Hugging Face Hub"),
    ],
)
def test_the_hub_s_refusals_are_said_plainly(
    cache: Path, monkeypatch: pytest.MonkeyPatch, error: str, words: str
) -> None:
    from huggingface_hub import errors

    def refuse() -> list[str]:
        raise _http_error(getattr(errors, error))

    _online(monkeypatch, refuse)
    with pytest.raises(ConfigError, match=words):
        hub.resolve("org/model", "v9")


def test_an_unreachable_hub_falls_back_to_the_cache(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable() -> list[str]:
        raise OSError("connection refused")

    _online(monkeypatch, unreachable)
    with pytest.raises(ConfigError, match=r"downloading it failed \(connection refused\)"):
        hub.resolve("org/model")
    cached = snapshot(cache, "org/model", {"config.json": "{}"}, refs=["main"])
    assert hub.resolve("org/model") == cached


def _specs(argv: list[str]) -> list[tuple[str, str]]:
    args: argparse.Namespace = build_parser().parse_args(["serve", *argv])
    return [(m.name, m.spec) for m in build_settings(args, environ={}).models]


def test_serve_takes_a_hub_id_its_revision_and_trust_in_its_code(tmp_path: Path) -> None:
    assert _specs(["--model", "BAAI/bge-small-en-v1.5", "--revision", "v1.0"]) == [
        ("bge-small-en-v1.5", "BAAI/bge-small-en-v1.5:revision=v1.0")
    ]
    argv = ["--model", "BAAI/bge-small-en-v1.5", "--model", "minilm", "--revision", "abc"]
    argv += ["--trust-remote-code", "bge-small-en-v1.5=on"]
    # A revision for every model skips those that are not Hub ids.
    assert _specs(argv) == [
        ("bge-small-en-v1.5", "BAAI/bge-small-en-v1.5:trust_remote_code=on,revision=abc"),
        ("all-MiniLM-L6-v2", "minilm"),
    ]
    assert _specs(["--model", "org/m", "--trust-remote-code"]) == [
        ("m", "org/m:trust_remote_code=on")
    ]
    with pytest.raises(ConfigError, match="revision applies to a model named by its Hub id"):
        _specs(["--model", "minilm", "--revision", "all-MiniLM-L6-v2=main"])
    config = tmp_path / "serve.toml"
    config.write_text('[models.bge]\nspec = "BAAI/bge-small-en-v1.5"\nrevision = "v1.0"\n')
    assert _specs(["--config", str(config)]) == [("bge", "BAAI/bge-small-en-v1.5:revision=v1.0")]
