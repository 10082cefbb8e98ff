"""A model by its name: a Hugging Face Hub id resolved to a folder through huggingface_hub's cache.

``--model BAAI/bge-small-en-v1.5`` (an ``org/name`` that is not a folder here, with
``revision=`` a branch, tag or commit; ``main`` when none is named) is read as TEI, Infinity
and vLLM read it, through huggingface_hub's own cache:

* the cache is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``~/.cache/huggingface/hub`` (huggingface_hub's rule, read when the model is resolved);
  a model is the snapshot ``models--org--name/snapshots/<commit>/``, and a branch or tag
  is the commit its ``refs/<revision>`` file names;
* where the network allows, the snapshot is downloaded (or brought up to date) with
  ``huggingface_hub.snapshot_download``, leaving out the files batchserve never reads: other
  frameworks' weights (TensorFlow, Flax, Rust, Core ML, GGUF), the repository's own ONNX
  and OpenVINO exports (batchserve exports from the weights itself), and a ``.bin`` beside
  a ``.safetensors`` of the same folder; a private or gated model takes ``HF_TOKEN``;
* with ``HF_HUB_OFFLINE=1`` (as huggingface_hub read it), or when the Hub cannot be
  reached, only the cache is read.

An error names what was tried (the id, the revision, the cache folder) and what to do.
What the folder holds is then judged like any folder
(:meth:`~batchserve.models.kinds.FolderKind.check`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from batchserve.errors import ConfigError

__all__ = ["NEVER_READ", "cached_snapshot", "hub_cache", "ignored", "resolve"]

#: Files of a Hub repository that batchserve never reads (``snapshot_download`` patterns).
NEVER_READ = (
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.gguf",
    "*.tflite",
    "*.mlmodel",
    "*.onnx",
    "*.onnx_data",
    "onnx/*",
    "openvino/*",
    "coreml/*",
    "tf_model*",
    "flax_model*",
    "rust_model*",
)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HINT = "pip install 'batchserve[embeddings]' (huggingface_hub comes with it)"


def hub_cache(environ: Mapping[str, str] | None = None) -> Path:
    """The huggingface_hub cache folder the environment names (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HUGGINGFACE_HUB_CACHE"):  # huggingface_hub's older name, still read
        return Path(env["HUGGINGFACE_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    home = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(home) / "huggingface" / "hub"


def ignored(files: list[str]) -> list[str]:
    """The ``snapshot_download`` ignore patterns for a repository holding ``files``.

    :data:`NEVER_READ`, and each ``.bin`` weights file of a folder that also holds
    ``.safetensors`` weights (transformers and sentence-transformers read the latter).
    """
    safetensors = {str(PurePosixPath(f).parent) for f in files if f.endswith(".safetensors")}
    shadowed = [
        f for f in files if f.endswith(".bin") and str(PurePosixPath(f).parent) in safetensors
    ]
    return [*NEVER_READ, *shadowed]


def cached_snapshot(repo_id: str, revision: str, cache: Path) -> Path | None:
    """The snapshot of ``repo_id`` at ``revision`` in ``cache``, if it is there.

    A commit (40 hex digits) is its own snapshot; a branch or tag is the commit its
    ``refs/<revision>`` file names.
    """
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    commit: str | None = revision if _COMMIT.match(revision) else None
    ref = storage / "refs" / revision
    if commit is None and ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
    if commit is None:
        return None
    snapshot = storage / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def resolve(repo_id: str, revision: str | None = None) -> Path:
    """The folder of the Hub model ``repo_id`` at ``revision``: cached, or downloaded.

    Blocks while it downloads (call it off the event loop).

    Args:
        repo_id: ``org/name``.
        revision: a branch, tag or commit; None is ``main``.

    Raises:
        ConfigError: the model is not on the Hub, has no such revision, is gated, or is
            not in the cache when the Hub cannot be (or must not be) reached; the message
            names the id, the revision and the cache, and what to do.
        ImportError: huggingface_hub is missing (the message names the pip command).
    """
    try:
        from huggingface_hub import constants
    except ImportError as exc:
        raise ImportError(f"a model named by its Hub id needs huggingface_hub: {_HINT}") from exc
    cache = hub_cache()
    rev = revision or "main"
    if constants.HF_HUB_OFFLINE:
        return _from_cache(repo_id, rev, cache, "HF_HUB_OFFLINE=1 forbids downloading it")
    try:
        return _download(repo_id, revision, cache)
    except ConfigError:
        raise
    except Exception as exc:  # the Hub cannot be reached: the cache may still hold it
        return _from_cache(repo_id, rev, cache, f"downloading it failed ({exc})")


def _download(repo_id: str, revision: str | None, cache: Path) -> Path:
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    rev = revision or "main"
    try:
        files = HfApi().list_repo_files(repo_id, revision=revision)
    except GatedRepoError:
        raise ConfigError(
            f"model {repo_id!r} is gated on the Hugging Face Hub: accept its terms on its "
            "page and set HF_TOKEN to a token of that account"
        ) from None
    except RevisionNotFoundError:
        raise ConfigError(
            f"model {repo_id!r} has no revision {rev!r} on the Hugging Face Hub: name a "
            "branch, tag or commit it has (--revision)"
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"no model {repo_id!r} on the Hugging Face Hub (a private one needs HF_TOKEN); "
            "check the id, or pass the folder it is in"
        ) from None
    folder: Any = snapshot_download(
        repo_id, revision=revision, cache_dir=cache, ignore_patterns=ignored(files)
    )
    return Path(folder)


def _from_cache(repo_id: str, rev: str, cache: Path, why: str) -> Path:
    found = cached_snapshot(repo_id, rev, cache)
    if found is not None:
        return found
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    raise ConfigError(
        f"model {repo_id!r} at revision {rev!r} is not in the Hugging Face cache {cache} "
        f"(no snapshot under {storage} for it), and {why}: download it where the network "
        f"allows (hf download {repo_id} --revision {rev}, with HF_HUB_CACHE={cache}), or "
        "pass the folder it is in"
    )
