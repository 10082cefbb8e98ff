"""A model folder's kind, read from its files, and what batchserve refuses to serve.

:func:`folder_kind` reads the kind from a folder's files alone (no weights are loaded), as
sentence-transformers and TEI decide it:

* a sentence-transformers folder (``modules.json``) is what its
  ``config_sentence_transformers.json`` declares (``model_type``, ``SentenceTransformer`` when
  it says nothing): a ``SentenceTransformer`` is an embedder whatever its architecture (a
  decoder embedder such as Qwen3-Embedding is saved as ``Qwen3Model`` or
  ``Qwen3ForCausalLM`` with Transformer and last-token Pooling modules, and all-mpnet-base-v2
  as ``MPNetForMaskedLM``); a ``CrossEncoder`` is a reranker or a classifier (a causal LM
  scoring with ``LogitScore``, its yes/no logits after its chat template: an LLM reranker);
  a ``SparseEncoder`` of ``MLMTransformer`` then ``SpladePooling`` a sparse embedder;
* a ColBERT folder as PyLate saves it (``model_type: ColBERT``, or a ``pylate.`` module:
  a Transformer, then ``Dense`` projections) is a multi-vector model
  (:data:`~batchserve.models.kinds.multivector.MULTIVECTOR`);
* any other folder is read from ``config.json``'s architectures, as ``save_pretrained`` wrote
  it: ``...ForSequenceClassification`` is a reranker or a classifier by its number of
  labels; a bare encoder or decoder (``BertModel``, ``Qwen3Model``) an embedder (pooled
  as sentence-transformers pools a folder without modules: the mean of its tokens); a
  causal LM with ``batchserve_reranker.json`` an LLM reranker (:mod:`.llm_template`).

What batchserve does not serve is refused, with what was found and why
(:attr:`FolderKind.refusal`; :meth:`FolderKind.check` raises it at start): a task head with
no sentence-transformers modules (a masked-LM head, whose vectors no one trained, and which
TEI reads as SPLADE; a causal LM with no declared template, whose mean-pooled states are
not an embedding; token classification, question answering, generation); a causal LM
``CrossEncoder`` with neither a sequence classification head nor ``LogitScore`` (with
``LogitScore`` it is an LLM reranker, served: yes/no logits after its chat
template); a ``SparseEncoder`` of other modules (inference-free SPLADE's ``Router``, a
``SparseAutoEncoder``), sentence-transformers' multi-vector (``MultiVectorEncoder``)
encoders, and a Stanford ColBERT checkpoint not saved by PyLate (``HF_ColBERT``); an
image or audio model (``vision_config`` or ``audio_config`` in ``config.json``, a processor's
files, a CLIP module), as Infinity tells them apart. A folder whose ``config.json`` names
code of its own (``auto_map``) is refused unless the user trusts it
(``--trust-remote-code``): without that code, transformers would load the architecture it
knows under that name and serve vectors the model never made (jina-embeddings-v3's LoRA
adapters left out of an ``xlm-roberta``).

A bare masked-LM folder is served as a sparse embedder only when the operator says so
(``--pooling splade``): :func:`splade_kind` is its kind then, as TEI reads such a folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchserve.errors import ConfigError
from batchserve.models.kinds.classifier import CLASSIFIER
from batchserve.models.kinds.embedding import EMBEDDING
from batchserve.models.kinds.kind import Kind
from batchserve.models.kinds.llm_template import TEMPLATE_FILE, RerankTemplate, read_template
from batchserve.models.kinds.multivector import MULTIVECTOR
from batchserve.models.kinds.reranker import RERANKER
from batchserve.models.kinds.sparse import SPARSE

__all__ = ["SERVES", "SPLADE", "FolderKind", "folder_kind", "splade_kind"]

#: What batchserve serves, said in every refusal of a folder.
SERVES = (
    "batchserve serves text embedders (a sentence-transformers folder, or an encoder saved "
    "with save_pretrained), rerankers and classifiers with a sequence classification head, "
    "LLM rerankers (a causal LM with a yes/no template: batchserve_reranker.json or a "
    "CrossEncoder's LogitScore), SPLADE sparse embedders (a SparseEncoder folder: a "
    "masked-LM transformer, SpladePooling; or a masked-LM folder with --pooling splade), "
    "and ColBERT multi-vector models as PyLate saves them"
)
#: The pooling that serves a bare masked-LM folder as a sparse embedder (``--pooling``).
SPLADE = "splade"
#: The modules of a SparseEncoder folder batchserve serves: a masked-LM transformer (the
#: ``Transformer`` of task ``fill-mask`` sentence-transformers 6 saves, or 5's
#: ``MLMTransformer``), then ``SpladePooling``.
_SPARSE_MODULES = (("Transformer", "SpladePooling"), ("MLMTransformer", "SpladePooling"))

#: Task heads that are not an embedder, by the end of an architecture's name: what it is.
_HEADS: dict[str, str] = {
    "ForMaskedLM": "a masked-language-model head",
    "ForPreTraining": "a pre-training head (masked LM and next sentence)",
    "ForCausalLM": "a causal language model",
    "LMHeadModel": "a causal language model",
    "ForConditionalGeneration": "a sequence-to-sequence generation model",
    "ForTokenClassification": "a token classification head",
    "ForQuestionAnswering": "a question answering head",
    "ForMultipleChoice": "a multiple choice head",
    "ForNextSentencePrediction": "a next sentence prediction head",
}
#: Why each head is no embedder, said after what it is.
_WHY: dict[str, str] = {
    "ForMaskedLM": "its vectors would be the mean of token states no one trained to embed "
    "(sentence-transformers pools such a folder with MEAN pooling and a warning; TEI reads it "
    "as a SPLADE sparse model: serve it as one with --pooling splade)",
    "ForCausalLM": "it declares no reranking template and no sentence-transformers modules, so "
    "its mean-pooled states would be served as an embedding no one trained (a decoder "
    "embedder such as Qwen3-Embedding is saved with modules.json: Transformer and last-token "
    "Pooling); an LLM reranker declares its yes/no template in "
    f'{TEMPLATE_FILE} (e.g. {{"template": "qwen3"}}, see docs/serving/rerank.md)',
}
#: Files of an image or audio processor.
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
#: Keys of an image or audio model's own ``config.json`` (a ViT, a Whisper encoder), where it
#: has no nested ``vision_config`` and no processor's file.
_MEDIA_KEYS = ("image_size", "patch_size", "num_channels", "num_mel_bins")


@dataclass(frozen=True, slots=True, kw_only=True)
class FolderKind:
    """What a model folder's files say it is.

    Attributes:
        kind: its kind: :data:`~batchserve.models.kinds.EMBEDDING`,
            :data:`~batchserve.models.kinds.RERANKER` or
            :data:`~batchserve.models.kinds.CLASSIFIER`.
        labels: the label of each logit, in order (``id2label``); empty for an embedder.
        architecture: the first architecture named, if any.
        refusal: why batchserve does not serve it, with what was found (None: it does);
            ``kind`` is then what it would have been served as.
        remote_code: what ``auto_map`` in ``config.json`` names (the folder's own code),
            as ``AutoModel=module.Class`` pairs; empty when it names none.
        template: an LLM reranker's yes/no template (a causal LM whose folder declares one
            in ``batchserve_reranker.json``, :mod:`.llm_template`); None for any other.
        llm: whether it is an LLM reranker: a causal LM with that template, or a
            sentence-transformers ``CrossEncoder`` scoring with ``LogitScore``.
    """

    kind: Kind
    labels: tuple[str, ...] = ()
    architecture: str | None = None
    refusal: str | None = None
    remote_code: tuple[str, ...] = ()
    template: RerankTemplate | None = None
    llm: bool = False

    def check(self, where: str | Path, *, trust_remote_code: bool = False) -> None:
        """Refuse a folder batchserve does not serve, or whose code it was not told to trust.

        Raises:
            ConfigError: the refusal, naming ``where``, what was found and what is served.
        """
        if self.refusal is not None:
            raise ConfigError(f"{where}: {self.refusal}; {SERVES}")
        if self.remote_code and not trust_remote_code:
            raise ConfigError(
                f"{where}: config.json's auto_map names code the folder ships "
                f"({', '.join(self.remote_code)}), which runs only when trusted: without it "
                "transformers would load the architecture it knows by that name, not this "
                "model; pass --trust-remote-code (trust_remote_code=on in the SPEC or the "
                "config file) if you trust its authors"
            )


def folder_kind(path: str | Path) -> FolderKind:
    """The kind of the model saved in ``path``, and why it is refused if it is.

    See the module docstring for the rules.

    Raises:
        ConfigError: ``config.json``, ``modules.json`` or
            ``config_sentence_transformers.json`` is there but not a JSON object (or list),
            or a sequence classification model's labels are malformed.
    """
    folder = Path(path)
    raw_modules = _json(folder / "modules.json", list)
    modules = (
        [m for m in raw_modules if isinstance(m, dict)] if isinstance(raw_modules, list) else None
    )
    config_file = folder / "config.json"
    if modules is not None:
        # The Transformer module's own folder holds config.json in older layouts.
        sub = next(
            (
                str(m.get("path"))
                for m in modules
                if str(m.get("type", "")).endswith("Transformer") and m.get("path")
            ),
            "",
        )
        if sub and not config_file.is_file() and (folder / sub / "config.json").is_file():
            config_file = folder / sub / "config.json"
    config = _json(config_file, dict) or {}
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    first = architectures[0] if architectures else None
    auto_map = config.get("auto_map")
    remote = (
        tuple(f"{k}={v}" for k, v in auto_map.items())
        if isinstance(auto_map, dict)
        else ((str(auto_map),) if auto_map else ())
    )
    found = f"config.json architectures: {', '.join(architectures) or 'none'}"
    classifying = any(a.endswith("ForSequenceClassification") for a in architectures)
    kind = EMBEDDING
    labels: tuple[str, ...] = ()
    if classifying:
        labels = _labels(config, config_file)
        kind = RERANKER if len(labels) == 1 else CLASSIFIER
    if modules is not None and _declares(folder) == "SparseEncoder":
        kind = SPARSE
    refusal = _media(folder, config, modules)
    template: RerankTemplate | None = None
    colbert = _colbert(folder, modules)
    if colbert is not None:
        kind = MULTIVECTOR
        refusal = refusal or (colbert or None)
    elif refusal is None and "HF_ColBERT" in architectures:
        refusal = (
            f"a Stanford ColBERT checkpoint with no sentence-transformers modules ({found}); "
            "load it once with pylate.models.ColBERT and save it (ColBERT.save) to serve it"
        )
    elif refusal is None and modules is not None:
        refusal = _declared(folder, modules, classifying, found)
        if refusal is None and _logit_score(modules, classifying):
            kind, labels = RERANKER, ("LABEL_0",)  # a CrossEncoder's causal LM asked yes/no
    elif refusal is None and not classifying:
        refusal = _head(architectures, found)
        template = _llm_reranker(folder, architectures)
        if template is not None:  # a causal LM asked yes or no: a reranker
            kind, labels, refusal = RERANKER, ("LABEL_0",), None
    return FolderKind(
        kind=kind,
        labels=labels,
        architecture=first,
        refusal=refusal,
        remote_code=remote,
        template=template,
        llm=template is not None or (modules is not None and _logit_score(modules, classifying)),
    )


def _logit_score(modules: list[dict[str, Any]], classifying: bool) -> bool:
    # A CrossEncoder's LogitScore module: a causal LM's yes/no logits (sentence-transformers).
    types = [str(m.get("type", "")).rpartition(".")[2] for m in modules]
    return not classifying and "LogitScore" in types


def _llm_reranker(folder: Path, architectures: list[str]) -> RerankTemplate | None:
    # A causal LM is a reranker when its folder declares the yes/no template.
    causal = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures)
    return read_template(folder) if causal else None


def splade_kind(path: str | Path, found: FolderKind | None = None) -> FolderKind:
    """The kind of a bare masked-LM folder served with ``--pooling splade``: sparse.

    ``found`` is :func:`folder_kind`'s answer for ``path`` (read here if not given). A
    folder with sentence-transformers modules keeps its own declared kind, as a folder
    whose architecture has no masked-LM head is refused: ``--pooling splade`` names the
    pooling of a ``...ForMaskedLM`` alone.

    Raises:
        ConfigError: the folder is not a bare ``...ForMaskedLM`` (the message names what it
            is), or its files are malformed.
    """
    folder = Path(path)
    found = found if found is not None else folder_kind(folder)
    if (folder / "modules.json").is_file():
        what = "a sentence-transformers folder, which declares its own pooling"
    elif found.architecture is None or not found.architecture.endswith("ForMaskedLM"):
        what = f"of architecture {found.architecture or 'none'}, with no masked-LM head"
    else:
        what = ""
    if what:
        raise ConfigError(
            f"{path}: --pooling {SPLADE} serves a bare ...ForMaskedLM folder (no modules.json) "
            f"as a SPLADE sparse embedder; this folder is {what} (drop --pooling)"
        )
    media = _media(folder, _json(folder / "config.json", dict) or {}, None)
    return FolderKind(
        kind=SPARSE, architecture=found.architecture, refusal=media, remote_code=found.remote_code
    )


def _declares(folder: Path) -> str:
    # What a sentence-transformers folder declares itself (its model_type).
    st = _json(folder / "config_sentence_transformers.json", dict) or {}
    return str(st.get("model_type") or "SentenceTransformer")


def _json(file: Path, shape: type) -> Any:
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file} is not readable JSON: {exc}") from exc
    if not isinstance(data, shape):
        raise ConfigError(
            f"{file} must hold a JSON {'object' if shape is dict else 'list'}, "
            f"got {type(data).__name__}"
        )
    return data


def _media(
    folder: Path, config: dict[str, Any], modules: list[dict[str, Any]] | None
) -> str | None:
    # An image or audio model, as Infinity tells them apart (and a CLIP module of
    # sentence-transformers): this server embeds texts only.
    keys = [k for k in ("vision_config", "audio_config", *_MEDIA_KEYS) if k in config]
    files = [f for f in _PROCESSOR_FILES if (folder / f).is_file()]
    clip = [
        str(m.get("type")) for m in modules or () if str(m.get("type", "")).endswith("CLIPModel")
    ]
    if not (keys or files or clip):
        return None
    what = [f"config.json has {k}" for k in keys] + [f"{f} is there" for f in files]
    what += [f"modules.json holds {c}" for c in clip]
    return f"an image or audio model ({'; '.join(what)}), and batchserve embeds text only"


def _declared(
    folder: Path, modules: list[dict[str, Any]], classifying: bool, found: str
) -> str | None:
    # A sentence-transformers folder is what its config declares.
    declared = _declares(folder)
    types = [str(m.get("type", "")).rpartition(".")[2] for m in modules]
    if declared == "SentenceTransformer":
        return None
    if declared == "CrossEncoder":
        if classifying:
            return None
        if "LogitScore" in types:
            return None  # an LLM reranker: the library renders its pairs (engines.llm_rerank)
        return f"a CrossEncoder without a sequence classification head ({found})"
    if declared == "SparseEncoder":
        if tuple(types) in _SPARSE_MODULES:
            return None
        return (
            f"a SparseEncoder of modules {', '.join(types)} ({found}); batchserve serves a "
            "SparseEncoder of a masked-LM Transformer (or MLMTransformer) then SpladePooling "
            "only (not an inference-free Router with SparseStaticEmbedding, nor a "
            "SparseAutoEncoder)"
        )
    if declared == "MultiVectorEncoder":
        return (
            f"a multi-vector encoder (sentence-transformers' MultiVectorEncoder: modules "
            f"{', '.join(types)}), whose recipe batchserve does not run (it serves ColBERT "
            "folders as PyLate saves them: model_type ColBERT)"
        )
    return f"a sentence-transformers {declared} model, which batchserve does not know"


#: The module types a ColBERT folder as PyLate saves it holds, by the end of their names.
_COLBERT_MODULES = ("Transformer", "Dense")


def _colbert(folder: Path, modules: list[dict[str, Any]] | None) -> str | None:
    # A ColBERT folder as PyLate saves it: config_sentence_transformers.json says
    # model_type ColBERT, or a module is PyLate's. None: not one; "" one served; else why
    # it is refused (modules other than the transformer and its projections).
    if modules is None:
        return None
    st = _json(folder / "config_sentence_transformers.json", dict) or {}
    types = [str(m.get("type", "")) for m in modules]
    if st.get("model_type") != "ColBERT" and not any(t.startswith("pylate.") for t in types):
        return None
    names = [t.rpartition(".")[2] for t in types]
    if names and names[0] == "Transformer" and all(n == "Dense" for n in names[1:]):
        return ""
    return (
        f"a ColBERT folder with modules {', '.join(names) or 'none'}: batchserve serves "
        "PyLate's (a Transformer, then Dense projections)"
    )


def _head(architectures: list[str], found: str) -> str | None:
    # A folder with no sentence-transformers modules: a task head other than sequence
    # classification is no embedder (see _HEADS).
    for arch in architectures:
        for suffix, what in _HEADS.items():
            if arch.endswith(suffix):
                group = {"ForPreTraining": "ForMaskedLM", "LMHeadModel": "ForCausalLM"}.get(
                    suffix, suffix
                )
                why = _WHY.get(group, "it is not an embedder, a reranker or a classifier")
                return f"{what} with no sentence-transformers modules ({found}): {why}"
    return _unknown_head(architectures, found)


def _unknown_head(architectures: list[str], found: str) -> str | None:
    # A task head nobody listed (``...ForImageClassification``, a name of its own): served
    # as an embedder, its vectors would be the mean of states trained for something else.
    for arch in architectures:
        head = arch.rfind("For")
        if head > 0 and arch[head + 3 : head + 4].isupper():
            return (
                f"a model with a head batchserve does not know ({found}): {arch[head:]} is "
                "neither a bare encoder or decoder (...Model) nor a sequence classification "
                "head, so what it outputs is not known to be an embedding"
            )
    return None


def _labels(config: dict[str, object], where: Path) -> tuple[str, ...]:
    id2label = config.get("id2label")
    count = config.get("num_labels")
    if isinstance(id2label, dict) and id2label:
        try:
            by_id = {int(k): str(v) for k, v in id2label.items()}
        except ValueError:
            raise ConfigError(f"{where}: id2label keys must be integers, got {id2label}") from None
        if sorted(by_id) != list(range(len(by_id))):
            raise ConfigError(f"{where}: id2label must name labels 0..N-1, got {sorted(by_id)}")
        return tuple(by_id[i] for i in range(len(by_id)))
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        return tuple(f"LABEL_{i}" for i in range(count))
    return ("LABEL_0", "LABEL_1")  # transformers' default num_labels
