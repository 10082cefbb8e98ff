"""Exporting a sentence-transformers model to ONNX and OpenVINO, once, into a cache folder.

Theory of operation
-------------------
Nothing is downloaded: every file is made from the weights on disk. :func:`ensure_exported`
returns the folder holding ``backend``'s model for the source folder, making it first if
it is not in the cache. The cache is keyed by the model and the backend::

    CACHE/<name>-<sha256 of the source files, 16 hex>/<backend>-r<RECIPE>/
        model.onnx | model.xml + model.bin
        export.json    written last: what was made and how

A folder without ``export.json`` is not an export. A new export is built in a temporary
folder beside the final one and moved into place with one ``rename`` (atomic on one file
system), under an exclusive ``flock`` on ``.<backend>.lock``: of two processes that race,
one builds while the other waits on the lock, then finds the finished export and uses it.
A crash leaves at most a temporary folder, which the next export removes.

What each backend is made of (for a reranker's or classifier's folder, the model's
``logits`` instead of the pipeline's ``sentence_embedding``; no ``openvino-int8`` for them):

* ``onnx``: the transformer module traced with ``torch.onnx.export`` (TorchScript
  exporter, opset 17; eager attention, which traces to the pattern ONNX Runtime's optimizer
  recognises), inputs ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when the
  tokenizer makes them), output ``token_embeddings``; dynamic batch and sequence axes. The
  pooling, ``Dense`` and ``Normalize`` modules are not in the graph: the folder's text
  pipeline (:mod:`batchserve.engines.pipeline`) computes them from the token embeddings,
  as it does for the torch engine.
* ``onnx-int8``: the ``onnx`` file through ONNX Runtime's transformer optimizer (attention,
  layer norms and GELU fused into its own ops), then its dynamic quantization: the weights
  of the linear layers and of the fused attention as int8 with one scale per output
  channel, activations quantized per pass, except the feed-forward output layers of the
  first two blocks (``layer.0``/``layer.1`` ``output/dense``), whose inputs (after GELU)
  carry the outliers int8 handles worst. Measured on the shipped set against torch fp32
  (mean / min cosine, nearest passage kept): one scale per tensor everywhere 0.955 /
  0.861 / 96.0% (fails the gate); per channel everywhere 0.9921 / 0.962 / 98.7%; this
  recipe 0.9942 / 0.972 / 98.7% at the same speed within the noise; every feed-forward
  output kept fp32 0.9954, but slower. With one thread on this AVX2 CPU (no VNNI) and
  short texts it runs 1.4-1.5x the fp32 ``onnx`` file at batch 32 and 2.4x at batch 1
  (the fusion alone adds 5% at batch 32, 20% at batch 1). Its activations' scales are
  taken per pass, so a text's vector depends on its batch-mates (the gate's batch
  invariance: 0.974, where fp32 gives 0.9999999): ``auto`` never serves it. A static
  recipe tried instead (ONNX Runtime's ``quantize_static``, QDQ, MinMax scales calibrated
  on 65 shipped texts, weights per channel) is invariant (0.9999999) but kept each
  reference-manual paragraph's nearest neighbour for 78% (88% with every feed-forward
  output layer in fp32; the gate asks 95%), at 1.5-1.8x the fp32 file's rate where
  dynamic int8 ran 2.1x (one thread, batch 32, AVX-512 VNNI, a busy machine): not kept.
* ``openvino``: the ``onnx`` file converted to OpenVINO's IR (``model.xml``/``model.bin``),
  weights in float32; the precision it computes in is chosen when it is compiled.
* ``openvino-int8``: OpenVINO's own post-training quantization (NNCF, the ``transformer``
  preset: int8 weights per channel and int8 activations with scales calibrated on 65
  shipped texts of every length), so OpenVINO runs its int8 kernels (VNNI or AMX where the CPU has
  them). The recipe before it, ONNX Runtime's dynamic int8 converted to IR, ran slower
  than OpenVINO's own float32, as OpenVINO executes those ops one by one.

No export is gated here: the quality gate (:mod:`batchserve.engines.gate`) runs once per
model and engine when an engine is first served or chosen, and its figures are cached.

:data:`RECIPE` is part of the folder name: a change to how a backend is made changes it,
so an old export is never taken for a new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batchserve.engines import telemetry
from batchserve.engines.quality_set import load as load_quality_set
from batchserve.errors import ConfigError

__all__ = [
    "RECIPE",
    "Exported",
    "ensure_exported",
    "model_folder",
    "model_key",
    "write_atomic",
    "write_cached",
]

#: How the backends are made; bump it when that changes (6: an embedder's graph ends at the
#: transformer's token embeddings).
RECIPE = 6
_MARKER = "export.json"
_ONNX_FILE = "model.onnx"
_OV_FILE = "model.xml"
# The feed-forward output layers of the first two blocks stay fp32 (see the docstring).
_INT8_EXCLUDE = ("layer.0/output/dense/", "layer.1/output/dense/")
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Exported:
    """A backend's exported model in the cache.

    Attributes:
        backend: ``onnx``, ``onnx-int8``, ``openvino`` or ``openvino-int8``.
        folder: the export's folder.
        model_file: the file to load (``model.onnx`` or ``model.xml``).
    """

    backend: str
    folder: Path
    model_file: Path


def model_key(source: Path) -> str:
    """A hex SHA-256 of the source folder's files: their relative paths and contents."""
    digest = hashlib.sha256()
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        rel = path.relative_to(source).as_posix()
        if rel.startswith(".") or "/." in rel or rel.endswith(".md"):
            continue
        digest.update(rel.encode() + b"\0")
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def model_folder(source: Path, cache_dir: Path) -> Path:
    """The cache folder of the model folder ``source``: its exports, reference and gates."""
    return Path(cache_dir) / f"{_slug(Path(source).name)}-{model_key(Path(source))[:16]}"


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` under a temporary name, then rename it into place.

    A reader sees the old file or the new one, never half of one (one file system).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_cached(path: Path, data: bytes) -> bool:
    """:func:`write_atomic` for a result that can be measured again; whether it was written.

    A cache folder that cannot be written (read-only, full) costs a warning and the
    measurement next time, never the start.
    """
    try:
        write_atomic(path, data)
    except OSError as exc:
        _log.warning(
            "could not keep %s in the cache (%s); it is measured again next time", path, exc
        )
        return False
    return True


def _read(folder: Path, backend: str) -> Exported | None:
    marker = folder / _MARKER
    if not marker.is_file():
        return None
    data = json.loads(marker.read_text(encoding="utf-8"))
    return Exported(backend=backend, folder=folder, model_file=folder / str(data["model_file"]))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        try:
            import fcntl
        except ImportError:  # not POSIX: the atomic rename alone keeps exports whole
            yield
            return
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def ensure_exported(source: Path, backend: str, cache_dir: Path) -> Exported:
    """The cached export of ``source`` for ``backend``, made first if missing.

    Blocks while exporting (seconds for the fp32 files, ten to twenty for OpenVINO's int8
    calibration) or while another process exports the same files. Safe to call from
    several processes at once.

    Args:
        source: a sentence-transformers model folder.
        backend: ``onnx``, ``onnx-int8``, ``openvino`` or ``openvino-int8``.
        cache_dir: the cache folder (created if missing).

    Raises:
        ConfigError: ``backend`` is not an exported backend.
        ImportError: the backend's extra is missing (the message names the pip command).
    """
    if backend not in ("onnx", "onnx-int8", "openvino", "openvino-int8"):
        raise ConfigError(
            f"backend must be onnx, onnx-int8, openvino or openvino-int8 to export, got {backend!r}"
        )
    _check_extra(backend)
    source = Path(source)
    parent = model_folder(source, cache_dir)
    folder = parent / f"{backend}-r{RECIPE}"
    done = _read(folder, backend)
    if done is not None:
        return done
    parent.mkdir(parents=True, exist_ok=True)
    with _locked(parent / f".{backend}.lock"):
        done = _read(folder, backend)
        if done is not None:
            return done
        for stale in parent.glob(f".{backend}-tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if folder.exists():  # an export that never finished (no marker)
            shutil.rmtree(folder)
        tmp = Path(tempfile.mkdtemp(prefix=f".{backend}-tmp-", dir=parent))
        try:
            meta = _build(source, backend, cache_dir, tmp)
            meta.update(
                backend=backend,
                recipe=RECIPE,
                source=str(source),
                source_sha256=model_key(source),
                created=datetime.now(UTC).isoformat(timespec="seconds"),
            )
            (tmp / _MARKER).write_text(json.dumps(meta, indent=1), encoding="utf-8")
            os.replace(tmp, folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    done = _read(folder, backend)
    assert done is not None
    return done


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name).strip("-.") or "model"


def _check_extra(backend: str) -> None:
    try:
        if backend.startswith("onnx"):
            import onnxruntime  # noqa: F401
        else:
            telemetry.openvino()
        if backend == "openvino-int8":
            telemetry.nncf()
    except ImportError as exc:
        extra = "onnx" if backend.startswith("onnx") else "onnx,openvino"
        raise ImportError(
            f"backend {backend} needs the '{extra}' extra: pip install 'batchserve[{extra}]'"
        ) from exc


def _build(source: Path, backend: str, cache_dir: Path, out: Path) -> dict[str, Any]:
    _log.warning("exporting %s to %s (once; cached in %s)", source.name, backend, cache_dir)
    if backend == "onnx":
        _export_onnx(source, out / _ONNX_FILE)
        return {"model_file": _ONNX_FILE}
    if backend == "onnx-int8":
        fp32 = ensure_exported(source, "onnx", cache_dir)
        _quantize(source, fp32.model_file, out / _ONNX_FILE, fuse=True)
        return {"model_file": _ONNX_FILE}
    if backend == "openvino":
        fp32 = ensure_exported(source, "onnx", cache_dir)
        _convert_openvino(fp32.model_file, out / _OV_FILE)
        return {"model_file": _OV_FILE}
    if _answers_logits(source):
        raise ConfigError(
            "backend openvino-int8 is not offered for rerankers and classifiers yet "
            "(its calibration embeds texts); use openvino, onnx or onnx-int8"
        )
    ir = ensure_exported(source, "openvino", cache_dir)
    calibration = _quantize_openvino(source, ir.model_file, out / _OV_FILE)
    return {"model_file": _OV_FILE, "calibration_texts": calibration}


def _answers_logits(source: Path) -> bool:
    # A reranker's or classifier's folder: its kind's head answers logits (a sequence
    # classification model), exported as the model itself rather than as an embedder.
    from batchserve.models.kinds import Logits, folder_kind

    return isinstance(folder_kind(source).kind.head, Logits)


def _export_sequence_onnx(source: Path, path: Path) -> None:
    # A reranker's or classifier's folder: the sequence classification model itself, output
    # ``logits`` [batch, labels]; the protocol applies the activation.
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(source), local_files_only=True, attn_implementation="eager"
    ).eval()
    features = tokenizer(
        ["a query", "two"], ["a passage to trace", "x"], return_tensors="pt", padding=True
    )
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in features]

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: Any) -> Any:
            return self.model(**dict(zip(names, inputs, strict=True))).logits

    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["logits"] = {0: "batch"}
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Logits().eval(),
            tuple(features[n] for n in names),
            str(path),
            input_names=names,
            output_names=["logits"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def _export_onnx(source: Path, path: Path) -> None:
    import torch

    if _answers_logits(source):
        _export_sequence_onnx(source, path)
        return

    from batchserve.engines.embeddings import load_sentence_transformer
    from batchserve.engines.pipeline import MODEL_INPUTS, TextPipeline

    # The transformer alone: its token embeddings are pooled by the folder's text pipeline
    # (engines.pipeline), the torch engine's own code, so every pooling mode, Dense and
    # Normalize is one code on every engine. Eager attention traces to the plain pattern
    # that ONNX Runtime's optimizer fuses into its Attention op (the SDPA trace it does not
    # recognise).
    pipeline = TextPipeline.read(source)
    st = load_sentence_transformer(
        source, device="cpu", model_kwargs={"attn_implementation": "eager"}
    )
    features, _ = pipeline.tokenize(["an example text to trace", "two"])
    names = [n for n in MODEL_INPUTS if n in features]

    class Transformer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = st[0]

        def forward(self, *inputs: Any) -> Any:
            return self.module(dict(zip(names, inputs, strict=True)))["token_embeddings"]

    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["token_embeddings"] = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Transformer().eval(),
            tuple(torch.from_numpy(features[n]) for n in names),
            str(path),
            input_names=names,
            output_names=["token_embeddings"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


class _DropPreprocessHint(logging.Filter):
    # onnxruntime.quantization logs a hint through the root logger on every call.
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def _fuse(source: Path, src: Path, dst: Path) -> None:
    # ONNX Runtime's transformer optimizer: attention, layer norm and GELU fused into its
    # contrib ops (only what matches a BERT-like pattern; anything else is left as is).
    from onnxruntime.transformers.optimizer import optimize_model

    config_file = source / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    model = optimize_model(
        str(src),
        model_type="bert",
        num_heads=int(config.get("num_attention_heads", 0)),
        hidden_size=int(config.get("hidden_size", 0)),
    )
    model.save_model_to_file(str(dst))


def _quantize(source: Path, src: Path, dst: Path, *, fuse: bool) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    hint = _DropPreprocessHint()
    root = logging.getLogger()
    root.addFilter(hint)
    try:
        if fuse:
            fused = dst.with_name("fused.onnx")
            _fuse(source, src, fused)
            src = fused
        model = onnx.load(str(src), load_external_data=False)
        weights = {init.name for init in model.graph.initializer}
        nodes = [
            node.name
            for node in model.graph.node
            if (
                node.op_type == "Attention"
                or (node.op_type == "MatMul" and any(i in weights for i in node.input))
            )
            and not any(part in node.name for part in _INT8_EXCLUDE)
        ]
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=False,
            nodes_to_quantize=nodes,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        root.removeFilter(hint)
        if fuse:
            dst.with_name("fused.onnx").unlink(missing_ok=True)


def _convert_openvino(src: Path, dst: Path) -> None:
    ov = telemetry.openvino()

    ov.save_model(ov.convert_model(str(src)), str(dst), compress_to_fp16=False)


#: Calibration texts for OpenVINO's int8: every 16th text of the shipped set (65 texts of
#: every length), in batches of 8.
_CALIBRATION_STRIDE = 16
_CALIBRATION_BATCH = 8


def _quantize_openvino(source: Path, src: Path, dst: Path) -> int:
    # NNCF's post-training quantization with the transformer preset (it keeps the parts int8
    # handles badly, such as the attention's softmax, in floating point). The activations'
    # scales come from real passes over shipped texts of every length.
    from batchserve.engines.pipeline import TextPipeline

    nncf = telemetry.nncf()
    ov = telemetry.openvino()

    model = ov.Core().read_model(str(src))
    names = [port.get_any_name() for port in model.inputs]
    pipeline = TextPipeline.read(source)
    texts = sorted(load_quality_set().texts[::_CALIBRATION_STRIDE], key=len)
    batches = []
    for start in range(0, len(texts), _CALIBRATION_BATCH):
        features, _ = pipeline.tokenize(texts[start : start + _CALIBRATION_BATCH])
        ids = features["input_ids"]
        batches.append({n: features.get(n, 0 * ids) for n in names})
    # NNCF draws progress bars on stdout/stderr; a server's log is no place for them.
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        quantized = nncf.quantize(
            model,
            nncf.Dataset(batches),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(batches),
        )
    ov.save_model(quantized, str(dst), compress_to_fp16=False)
    return len(texts)
