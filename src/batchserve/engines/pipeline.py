"""One text pipeline for every engine: a model folder read once, as sentence-transformers reads it.

Theory of operation
-------------------
An embedding folder says, in files several versions of sentence-transformers wrote in
different places, how a text becomes a vector: the window, the tokenizer and its padding
side, lower-casing, the prompts and whether their tokens are pooled, the pooling mode, any
``Dense`` projections and whether a ``Normalize`` module ends it. :meth:`TextPipeline.read`
reads all of it once, the way the *installed* sentence-transformers does (6.x: the rules
below are read from 6.3.0's code, and each is checked against its ``encode`` by the suite's
zoo of tiny folders), and every engine tokenizes and pools through the one object it returns:
torch (:mod:`~batchserve.engines.embeddings`), ONNX Runtime and OpenVINO
(:mod:`~batchserve.engines.exported`): the pipeline is their
:class:`~batchserve.engines.heads.VectorHead`; and what the exports put in their graphs
(:mod:`~batchserve.engines.export`: the transformer alone, its output the token
embeddings). Between tokenizing and pooling an engine runs only the transformer.

What is read, and from where:

* **the modules**: ``modules.json`` lists them (a sentence-transformers 2 to 6 save,
  whatever the module types' import paths); a bare ``save_pretrained`` folder (no
  ``modules.json``) is a transformer and mean pooling, or last-token pooling when its
  architecture is a ``...ForCausalLM`` that is causal, as sentence-transformers builds it.
  A transformer, then a ``Pooling``, then any ``Dense`` and ``Normalize`` modules are
  served; any other module is refused at start with its name.
* **the window** (``max_seq_length``): ``max_seq_length`` in ``sentence_bert_config.json``
  (or its older names) where a version 2 to 5 wrote it; else ``model_max_length`` in the
  config's tokenizer arguments; else the tokenizer's own ``model_max_length``
  (``tokenizer_config.json``: where sentence-transformers 6 writes it), capped at the
  model's ``max_position_embeddings`` when it states one.
* **the tokenizer**: the folder's own, with its special tokens and padding side (left for
  a ``text-generation`` transformer task); ``do_lower_case`` adds a ``Lowercase``
  normalizer to it, as sentence-transformers 6 does (version 5 and older lower-cased the
  string in Python).
* **whitespace**: sentence-transformers 6 tokenizes a text as it is sent; 5 and older
  stripped it first. The installed version decides (:data:`STRIPS`), so a byte-level BPE
  folder (RoBERTa, Qwen) gets the vector its own library gives a text with spaces around it.
* **prompts** (``config_sentence_transformers.json``) and ``include_prompt``
  (``1_Pooling/config.json``): a prompt's tokens are its length in tokens alone, special
  tokens first, less a trailing special token (the prompt's length as ``encode`` measures
  it); with ``include_prompt: false`` they are kept out of the pooling (the pooling mask
  zeroed over them, after any left padding), one prompt per text, so a pass may mix texts
  of several prompts and none.
* **pooling** (``cls``, ``max``, ``mean``, ``mean_sqrt_len_tokens``, ``weightedmean``,
  ``lasttoken``, or several concatenated), then each ``Dense`` (its weights and activation
  as sentence-transformers loads them), then ``Normalize``: computed in numpy
  (:mod:`~batchserve.engines.pooling`)
  (float32) from the token embeddings, exactly as the library's padded pooling computes
  them, so every pooling mode, every projection and the normalization are one code for
  every engine. An engine returns what the folder's modules return: unit vectors only
  when the folder ends in ``Normalize`` (:attr:`TextPipeline.normalized`).

A folder whose transformer renders texts through its chat template (sentence-transformers
6 does for a ``save_pretrained`` folder whose tokenizer has one, and for a folder saved
with the ``message`` modality) is tokenized by the library's own ``preprocess``: the torch
engine hands it to :meth:`TextPipeline.tokenize`; an exported engine, which has none, is
refused with the reason.

Thread-safety: the fast tokenizer keeps state; :meth:`TextPipeline.tokenize` and
:meth:`TextPipeline.count` hold the pipeline's lock. Pooling holds nothing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from batchserve.engines.pooling import (
    POOLING_MODES,
    DenseLayer,
    activation_name,
    pool,
    prompt_mask,
)
from batchserve.errors import ConfigError
from batchserve.models.kinds import Prompts, folder_prompts, prompt_of

__all__ = [
    "EXTRA_HINT",
    "MODEL_INPUTS",
    "STRIPS",
    "Preprocess",
    "TextPipeline",
    "transformer_tokenizer",
]

#: The features a transformer reads; the rest of a pass's features are the pipeline's own.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
#: The transformer's configuration file, under each name sentence-transformers has read.
_ST_CONFIGS = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)
#: The one sentence a missing ``embeddings`` extra raises.
EXTRA_HINT = (
    "the embedding model needs the 'embeddings' extra: pip install 'batchserve[embeddings]'"
)
_HUB_KEYS = ("trust_remote_code", "token", "revision", "cache_dir", "local_files_only", "subfolder")
_SERVED = "a transformer, then Pooling, then any Dense and Normalize modules"


def _library_major() -> int:
    try:
        return int(importlib.metadata.version("sentence-transformers").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 6


#: Whether the installed sentence-transformers strips a text before tokenizing it (5 and
#: older did; 6 tokenizes it as sent).
STRIPS = _library_major() < 6

_Array = npt.NDArray[Any]
#: A library's own ``preprocess(texts, prompt=...)``, for the folders it must tokenize.
Preprocess = Callable[..., dict[str, Any]]


class TextPipeline:
    """A model folder's text pipeline, read once (see the module docstring).

    Build it with :meth:`read`. Attributes are read-only by convention.

    Attributes:
        folder: the model folder.
        layout: how the folder was saved: ``modules.json`` or ``save_pretrained``.
        window: the model's window in tokens (``max_seq_length``): longer texts are
            truncated to it.
        lower_case: texts are lower-cased (``do_lower_case``).
        padding_side: ``right`` or ``left`` (decoders: the last token is a real one).
        pooling_modes: the pooling, one mode or several concatenated.
        include_prompt: whether a prompt's tokens are pooled.
        dense: the ``Dense`` modules, in order.
        normalized: whether the folder ends in ``Normalize`` (unit vectors).
        dimension: the length of a vector.
        prompts: the folder's named prompts and its default.
        renders_messages: the library renders texts through the chat template (only its
            own ``preprocess`` tokenizes them).
        tokenizer: the folder's fast tokenizer, set up as the library sets it up.
    """

    def __init__(
        self,
        *,
        folder: Path,
        layout: str,
        tokenizer: Any,
        window: int,
        lower_case: bool,
        pooling_modes: tuple[str, ...],
        include_prompt: bool,
        steps: tuple[str | DenseLayer, ...],
        dimension: int,
        prompts: Prompts,
        renders_messages: bool = False,
    ) -> None:
        self.folder = folder
        self.layout = layout
        self.tokenizer = tokenizer
        self.window = window
        self.lower_case = lower_case
        self.padding_side = str(getattr(tokenizer, "padding_side", "right") or "right")
        self.pooling_modes = pooling_modes
        self.include_prompt = include_prompt
        self._steps = steps
        self.dense = tuple(s for s in steps if isinstance(s, DenseLayer))
        self.normalized = bool(steps) and steps[-1] == "normalize"
        self.dimension = dimension
        self.prompts = prompts
        self.renders_messages = renders_messages
        self._lock = threading.Lock()
        self._prompt_lengths: dict[str, int] = {}

    @property
    def pooling(self) -> str:
        """The pooling as sentence-transformers names it (``mean``; ``cls+mean`` for several)."""
        return "+".join(self.pooling_modes)

    def describe(self) -> dict[str, Any]:
        """What was read, as JSON-ready values (for logs and ``/status``)."""
        return {
            "layout": self.layout,
            "window": self.window,
            "pooling": self.pooling,
            "include_prompt": self.include_prompt,
            "dense": len(self.dense),
            "normalized": self.normalized,
            "lower_case": self.lower_case,
            "padding_side": self.padding_side,
            "prompts": sorted(self.prompts.prompts),
            "default_prompt": self.prompts.default,
            "renders_messages": self.renders_messages,
        }

    # -- reading --------------------------------------------------------------------------

    @classmethod
    def read(cls, folder: str | Path) -> TextPipeline:
        """The pipeline of the embedding folder ``folder``, read as the library reads it.

        Blocks while the tokenizer (and any ``Dense`` weights) load: well under a second.

        Raises:
            ConfigError: a module batchserve does not run, a transformer task other than
                feature extraction, or a malformed configuration; the message names it.
            ImportError: the ``embeddings`` extra is missing.
        """
        folder = Path(folder)
        modules = _modules(folder)
        if modules is None:
            return cls._read_bare(folder)
        first_type, first_path = modules[0]
        if first_type != "Transformer":
            raise ConfigError(
                f"{folder}/modules.json starts with a {first_type} module; batchserve serves "
                f"{_SERVED}"
            )
        tdir = folder / first_path if first_path else folder
        st_config = _st_config(tdir)
        task = st_config.get("transformer_task", "feature-extraction")
        if task != "feature-extraction":
            raise ConfigError(
                f"{tdir}: transformer_task {task!r} is not served as an embedder "
                "(batchserve embeds with feature-extraction transformers)"
            )
        modality = st_config.get("modality_config")
        renders_messages = isinstance(modality, dict) and "message" in modality
        tokenizer, lower = _tokenizer(
            tdir, st_config, lower_case=bool(st_config.get("do_lower_case"))
        )
        modes: tuple[str, ...] | None = None
        include_prompt = True
        steps: list[str | DenseLayer] = []
        dimension = 0
        for i, (module, path) in enumerate(modules[1:], start=1):
            where = folder / path if path else folder
            if module == "Pooling":
                if modes is not None or steps:
                    raise ConfigError(
                        f"{folder}/modules.json: module {i} is a second Pooling or follows a "
                        f"Dense; batchserve serves {_SERVED}"
                    )
                modes, include_prompt, dimension = _pooling(where)
            elif module == "Dense" and modes is not None:
                layer, dimension = _dense(where)
                steps.append(layer)
            elif module == "Normalize" and modes is not None:
                _check_normalize(where)
                steps.append("normalize")
            else:
                raise ConfigError(
                    f"{folder}/modules.json: module {i} is {module} at {path or '.'}, which "
                    f"batchserve does not run; it serves {_SERVED}"
                )
        if modes is None:
            raise ConfigError(
                f"{folder}/modules.json has no Pooling module (token embeddings are not "
                f"served); batchserve serves {_SERVED}"
            )
        return cls(
            folder=folder,
            layout="modules.json",
            tokenizer=tokenizer,
            window=int(tokenizer.model_max_length),
            lower_case=lower,
            pooling_modes=modes,
            include_prompt=include_prompt,
            steps=tuple(steps),
            dimension=dimension,
            prompts=folder_prompts(folder),
            renders_messages=renders_messages,
        )

    @classmethod
    def _read_bare(cls, folder: Path) -> TextPipeline:
        # A save_pretrained folder: what SentenceTransformer(folder) builds for it.
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        tokenizer, _ = _tokenizer(folder, {}, lower_case=False)
        architectures = getattr(config, "architectures", None) or []
        causal = (
            bool(architectures)
            and str(architectures[0]).endswith("ForCausalLM")
            and bool(getattr(config, "is_causal", True))
        )
        hidden = getattr(config, "hidden_size", None)
        if not isinstance(hidden, int):
            raise ConfigError(f"{folder}/config.json states no hidden_size for its vectors")
        return cls(
            folder=folder,
            layout="save_pretrained",
            tokenizer=tokenizer,
            window=int(tokenizer.model_max_length),
            lower_case=False,
            pooling_modes=("lasttoken",) if causal else ("mean",),
            include_prompt=True,
            steps=(),
            dimension=hidden,
            prompts=folder_prompts(folder),
            renders_messages=getattr(tokenizer, "chat_template", None) is not None,
        )

    # -- tokenizing -----------------------------------------------------------------------

    def prompt_length(self, prompt: str | None) -> int:
        """The tokens of ``prompt`` that ``include_prompt: false`` keeps out of the pooling.

        The prompt tokenized alone, special tokens first, less a trailing special token
        (as sentence-transformers 6 measures it); 0 for no prompt.
        """
        if not prompt:
            return 0
        known = self._prompt_lengths.get(prompt)
        if known is not None:
            return known
        with self._lock:
            ids = self.tokenizer([self._prepared(prompt)], truncation=True)["input_ids"][0]
        n = len(ids)
        if ids and ids[-1] in set(self.tokenizer.all_special_ids):
            n -= 1
        self._prompt_lengths[prompt] = n
        return n

    def _prepared(self, text: str) -> str:
        # What sentence-transformers 5 and older did to a text before tokenizing it.
        if not STRIPS:
            return text
        text = text.strip()
        return text.lower() if self.lower_case else text

    def tokenize(
        self, texts: Sequence[str], *, preprocess: Preprocess | None = None
    ) -> tuple[dict[str, _Array], list[int]]:
        """One pass's features (padded to its longest text) and each text's tokens.

        The features are numpy arrays: the transformer's inputs (:data:`MODEL_INPUTS` the
        tokenizer makes) and, where prompts' tokens are kept out of the pooling,
        ``pooling_mask``. A text's tokens count its special tokens, after truncation.

        Args:
            texts: the texts (a :class:`~batchserve.models.kinds.PromptedText` carries its
                prompt).
            preprocess: the library's own ``preprocess``, for a folder that renders texts
                through its chat template (see the module docstring).

        Raises:
            ConfigError: the folder renders texts as chat messages and no ``preprocess``
                was given.
        """
        if self.renders_messages:
            if preprocess is None:
                raise ConfigError(
                    f"{self.folder.name}: sentence-transformers renders this folder's texts "
                    "through its chat template, which only the torch engine reproduces "
                    "(serve it with --backend torch)"
                )
            return self._tokenize_messages(texts, preprocess)
        with self._lock:
            enc = self.tokenizer(
                [self._prepared(t) for t in texts],
                padding=True,
                truncation="longest_first",
                return_tensors="np",
            )
        features = {n: np.asarray(enc[n], dtype=np.int64) for n in MODEL_INPUTS if n in enc}
        counts = [int(c) for c in features["attention_mask"].sum(axis=1)]
        if not self.include_prompt:
            lengths = [self.prompt_length(prompt_of(t)) for t in texts]
            if any(lengths):
                features["pooling_mask"] = prompt_mask(features["attention_mask"], lengths)
        return features, counts

    def _tokenize_messages(
        self, texts: Sequence[str], preprocess: Preprocess
    ) -> tuple[dict[str, _Array], list[int]]:
        # The library's preprocess per prompt (it takes one per call), padded to one width.
        groups: dict[str | None, list[int]] = {}
        for i, t in enumerate(texts):
            groups.setdefault(prompt_of(t), []).append(i)
        parts: list[tuple[list[int], dict[str, _Array]]] = []
        for prompt, rows in groups.items():
            raw = [getattr(texts[i], "text", texts[i]) for i in rows]
            with self._lock:
                enc = preprocess(raw, prompt=prompt)
            parts.append(
                (rows, {n: np.asarray(enc[n], dtype=np.int64) for n in MODEL_INPUTS if n in enc})
            )
        width = max(p["attention_mask"].shape[1] for _, p in parts)
        pad = int(self.tokenizer.pad_token_id or 0)
        out = {n: np.full((len(texts), width), pad if n == "input_ids" else 0, np.int64)
               for n in parts[0][1]}  # fmt: skip
        for rows, part in parts:
            w = part["attention_mask"].shape[1]
            cols = slice(width - w, width) if self.padding_side == "left" else slice(0, w)
            for name, value in part.items():
                out[name][rows, cols] = value
        return out, [int(c) for c in out["attention_mask"].sum(axis=1)]

    def count(self, texts: Sequence[str], *, preprocess: Preprocess | None = None) -> list[int]:
        """Tokens per text as the model sees them (special tokens included, truncated)."""
        if self.renders_messages:
            return self.tokenize(texts, preprocess=preprocess)[1]
        with self._lock:
            enc = self.tokenizer([self._prepared(t) for t in texts], truncation="longest_first")
        return [len(ids) for ids in enc["input_ids"]]

    def untruncated(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text before truncation (special tokens included).

        A text of more than :attr:`window` tokens is cut to it in a pass.
        """
        with self._lock:
            enc = self.tokenizer([self._prepared(t) for t in texts], truncation=False)
        return [len(ids) for ids in enc["input_ids"]]

    # -- pooling --------------------------------------------------------------------------

    def pool(self, token_embeddings: _Array, features: dict[str, Any]) -> npt.NDArray[np.float32]:
        """One (sub-)pass's vectors from its token embeddings, as the folder's modules make them.

        Args:
            token_embeddings: ``(items, width, hidden)``, the transformer's output.
            features: the pass's features (its ``attention_mask``, and ``pooling_mask``
                where prompts are kept out), cut as the token embeddings were.

        Returns:
            ``(items, dimension)`` float32: pooled, through each ``Dense``, normalized only
            where the folder ends in ``Normalize``.
        """
        tokens = np.asarray(token_embeddings, dtype=np.float32)
        attention = np.asarray(features["attention_mask"])
        mask = np.asarray(features.get("pooling_mask", attention))
        out = np.concatenate(
            [pool(mode, tokens, attention, mask) for mode in self.pooling_modes], axis=1
        )
        for step in self._steps:
            if isinstance(step, DenseLayer):
                out = step(out)
            else:
                norms = np.linalg.norm(out, axis=1, keepdims=True)
                out = out / np.maximum(norms, 1e-12)
        return np.ascontiguousarray(out, dtype=np.float32)


# -- reading the folder's files -----------------------------------------------------------


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON: {exc}") from exc


def _modules(folder: Path) -> list[tuple[str, str]] | None:
    # (the module's class name, its path) per modules.json entry; None: no modules.json.
    path = folder / "modules.json"
    if not path.is_file():
        return None
    data = _json(path)
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path} must be a non-empty list of modules")
    out = []
    for i, entry in enumerate(sorted(data, key=lambda e: int(e.get("idx", 0)))):
        module_type = entry.get("type") if isinstance(entry, dict) else None
        if not isinstance(module_type, str):
            raise ConfigError(f"{path}: module {i} must name its type")
        out.append((module_type.rsplit(".", 1)[-1], str(entry.get("path") or "")))
    return out


def _st_config(tdir: Path) -> dict[str, Any]:
    for name in _ST_CONFIGS:
        if (tdir / name).is_file():
            data = _json(tdir / name)
            if not isinstance(data, dict):
                raise ConfigError(f"{tdir / name} must hold a JSON object")
            return data
    return {}


def _tokenizer(tdir: Path, st_config: dict[str, Any], *, lower_case: bool) -> tuple[Any, bool]:
    # The tokenizer as sentence-transformers 6's Transformer sets it up: the window from the
    # config's max_seq_length or tokenizer arguments, else the tokenizer's, capped at the
    # position embeddings; lower-casing as a normalizer; left padding for generation.
    from transformers import AutoConfig, AutoTokenizer

    kwargs = dict(st_config.get("processor_kwargs") or st_config.get("tokenizer_args") or {})
    for key in _HUB_KEYS:
        kwargs.pop(key, None)
    stated = st_config.get("max_seq_length")
    if stated is not None and "model_max_length" not in kwargs:
        kwargs["model_max_length"] = stated
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tdir), local_files_only=True, **kwargs)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{tdir}: its tokenizer does not load: {exc}") from exc
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"{tdir}: batchserve needs a fast tokenizer (tokenizer.json)")
    if "model_max_length" not in kwargs:
        config_kwargs = dict(st_config.get("config_kwargs") or st_config.get("config_args") or {})
        for key in _HUB_KEYS:
            config_kwargs.pop(key, None)
        config = AutoConfig.from_pretrained(str(tdir), local_files_only=True, **config_kwargs)
        positions = getattr(config, "max_position_embeddings", None)
        if isinstance(positions, int) and positions != -1:
            tokenizer.model_max_length = min(int(tokenizer.model_max_length), positions)
    if lower_case and not STRIPS:
        from tokenizers import normalizers

        normalizer: Any = tokenizer.backend_tokenizer.normalizer
        if not _lowercases(normalizer):
            parts: list[Any] = [normalizers.Lowercase()]
            if isinstance(normalizer, normalizers.Sequence):
                parts += list(cast(Any, normalizer))
            elif normalizer is not None:
                parts.append(normalizer)
            tokenizer.backend_tokenizer.normalizer = normalizers.Sequence(parts)
    return tokenizer, lower_case


def transformer_tokenizer(tdir: Path) -> tuple[Any, bool]:
    """The tokenizer of the transformer saved in ``tdir``, set up as sentence-transformers does.

    Its window, lower-casing and padding side read as :meth:`TextPipeline.read` reads an
    embedding folder's (a sparse encoder's ``MLMTransformer`` is the same transformer);
    also whether it lower-cases.

    Raises:
        ConfigError: a malformed configuration, or no fast tokenizer.
    """
    st_config = _st_config(tdir)
    return _tokenizer(tdir, st_config, lower_case=bool(st_config.get("do_lower_case")))


def _lowercases(normalizer: Any) -> bool:
    from tokenizers import normalizers

    if normalizer is None:
        return False
    if isinstance(normalizer, normalizers.Lowercase):
        return True
    if isinstance(normalizer, normalizers.Sequence):
        parts: Any = normalizer
        return any(isinstance(n, normalizers.Lowercase) for n in parts)
    return False


@functools.cache
def _st_modules() -> Any:
    # The library's module classes (Pooling, Dense), where its version keeps them: 6 moved
    # them from sentence_transformers.models, which it still answers with a warning.
    import warnings

    for path in (
        "sentence_transformers.sentence_transformer.modules",
        "sentence_transformers.models",
    ):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return importlib.import_module(path)
        except ImportError:
            continue
    raise ImportError(EXTRA_HINT)


def _pooling(where: Path) -> tuple[tuple[str, ...], bool, int]:
    # The pooling config as the library loads it (legacy pooling_mode_* keys included).
    module = _st_modules().Pooling.load(str(where))
    mode = getattr(module, "pooling_mode", None)
    if isinstance(mode, str):
        modes: tuple[str, ...] = (mode,)
    elif isinstance(mode, (tuple, list)):
        modes = tuple(str(m) for m in mode)
    else:  # sentence-transformers 5 and older: one flag per mode
        flags = {
            "cls": "pooling_mode_cls_token",
            "max": "pooling_mode_max_tokens",
            "mean": "pooling_mode_mean_tokens",
            "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
            "weightedmean": "pooling_mode_weightedmean_tokens",
            "lasttoken": "pooling_mode_lasttoken",
        }
        modes = tuple(m for m, flag in flags.items() if getattr(module, flag, False))
    for m in modes:
        if m not in POOLING_MODES:
            raise ConfigError(f"{where}: pooling mode {m!r} is not one of {POOLING_MODES}")
    return (
        modes,
        bool(getattr(module, "include_prompt", True)),
        int(module.get_embedding_dimension()),
    )


def _dense(where: Path) -> tuple[DenseLayer, int]:
    module = _st_modules().Dense.load(str(where))
    for key in ("module_input_name", "module_output_name"):
        if getattr(module, key, "sentence_embedding") != "sentence_embedding":
            raise ConfigError(
                f"{where}: a Dense module on {getattr(module, key)!r} is not served "
                "(batchserve projects the pooled sentence embedding)"
            )
    linear = module.linear
    residual = getattr(module, "residual", None)

    def numpy(t: Any) -> _Array:
        return np.asarray(t.detach().float().cpu().numpy(), dtype=np.float32)

    layer = DenseLayer(
        weight=numpy(linear.weight),
        bias=None if linear.bias is None else numpy(linear.bias),
        activation=activation_name(module.activation_function),
        residual=None if residual is None else numpy(residual.weight),
        use_residual=bool(getattr(module, "use_residual", False)),
    )
    return layer, int(module.out_features)


def _check_normalize(where: Path) -> None:
    config = where / "config.json"
    data = _json(config) if config.is_file() else {}
    for key in ("module_input_name", "module_output_name"):
        value = data.get(key) if isinstance(data, dict) else None
        if value not in (None, "sentence_embedding"):
            raise ConfigError(
                f"{where}: a Normalize module on {value!r} is not served "
                "(batchserve normalizes the sentence embedding)"
            )
