"""The texts at a model's edges, and every engine held to its own library on each of them.

Theory of operation: an engine that agrees with torch on average can still be wrong on the
texts where pipelines differ: one longer than the window (an engine that cuts at 512
tokens where the folder says 8,192), spaces around a text (an engine that strips them where
the installed sentence-transformers does not), the empty string, scripts the tokenizer
splits to bytes, a prompt whose tokens the folder keeps out of the pooling. The gate holds
every engine, torch included, to ``SentenceTransformer.encode`` itself (the library,
in-process, float32 on the CPU) on each such text, one by one:

* :func:`edge_texts` builds the set from the folder's own pipeline (its window, its
  tokenizer, its prompts): the empty string, texts with spaces, tabs and newlines around
  them, one text of each of many scripts, a text longer than the window (of
  :data:`LONGEST` tokens and a few where the window is larger), one longer than 512 tokens
  where the window is larger, and a short query with the default prompt and with each
  named one (the empty string too, under the first prompt);
* :func:`library_vectors` asks the library for their vectors, once per model, text set and
  library version (cached beside the model's exports);
* :func:`measure` runs the engine on them as the server would (the prompted texts as the
  routes make them, all in one pass of mixed lengths) and keeps the worst text's cosine
  and the largest error of a vector's length (which a folder without ``Normalize``
  serves as it is);
* :class:`Edges` holds the figures and the bounds of the engine's precision
  (:func:`cosine_floor`: 0.9999 at float32, 0.999 at half precision; int8 is judged by the
  meaning's bounds alone), and names the text an engine missed.

:func:`check` is the whole, cached per model and engine (``CACHE/<model>/gate/``). A named
float32 engine that fails it is refused (:mod:`batchserve.engines.gate`); ``auto`` gates
every engine it may choose, the reference too, with it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.export import model_folder, write_cached
from batchserve.engines.hardware import Engine
from batchserve.engines.pipeline import TextPipeline
from batchserve.models.kinds import apply_prompt

__all__ = [
    "FLOAT32_FLOOR",
    "HALF_FLOOR",
    "LONGEST",
    "SCRIPTS",
    "EdgeText",
    "Edges",
    "check",
    "compare",
    "cosine_floor",
    "edge_texts",
    "inputs",
    "library_vectors",
    "measure",
    "norm_bound",
]

_log = logging.getLogger(__name__)

#: The smallest cosine to the library a float32 engine may give any text.
FLOAT32_FLOOR = 0.9999
#: ... and a half-precision one (bfloat16, float16, their mixed forms).
HALF_FLOOR = 0.999
#: How the set is built; bump it when that changes (cached figures are then measured again).
_VERSION = 1
#: What a short query reads, for the prompted items.
_QUERY = "What is the capital of France?"
#: The longest window a text is sized past: a text of more tokens costs a large model's
#: gate (attention grows with its square) more than the few cut positions it would show.
LONGEST = 8192

#: One text of each of many scripts (and the Unicode corners tokenizers split differently).
SCRIPTS: tuple[tuple[str, str], ...] = (
    ("Chinese", "机器学习让计算机从数据中学习规律。"),
    ("Japanese", "東京は日本の首都で、とても大きな都市です。"),
    ("Korean", "서울은 대한민국의 수도입니다."),
    ("Arabic", "اللغة العربية تكتب من اليمين إلى اليسار."),
    ("Hebrew", "עברית נכתבת מימין לשמאל."),
    ("Russian", "Москва — столица России, большой город."),
    ("Greek", "ΟΔΟΣ Αθηνάς: η οδός της Αθήνας."),
    ("Hindi", "नमस्ते दुनिया, यह एक परीक्षण वाक्य है।"),
    ("Thai", "สวัสดีชาวโลก นี่คือประโยคทดสอบ"),
    ("Turkish", "\u0130stanbul'da ILIK bir g\u00fcn, \u0131slak sokaklar."),
    ("German", "Die Straße führt über die Brücke. ÄÖÜ"),
    ("emoji", "🚀✨ launch day 👩‍💻🎉"),
    ("combining marks", "cafe\u0301 nai\u0308ve re\u0301sume\u0301"),
)


def cosine_floor(dtype: str) -> float | None:
    """The per-text cosine floor of an engine computing in ``dtype`` (None: int8)."""
    if dtype == "float32":
        return FLOAT32_FLOOR
    if dtype.removesuffix("-mixed") in ("float16", "bfloat16"):
        return HALF_FLOOR
    return None


def norm_bound(dtype: str) -> float | None:
    """The largest relative error of a vector's length an engine in ``dtype`` may make."""
    floor = cosine_floor(dtype)
    if floor is None:
        return None
    return 1e-3 if floor == FLOAT32_FLOOR else 1e-2


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeText:
    """One text of the set.

    Attributes:
        label: what it is, for a failure's message (``a text longer than the window``).
        text: the text as a caller sends it.
        prompt_name: the prompt a caller names (None: the folder's default, as a request
            naming none gets).
    """

    label: str
    text: str
    prompt_name: str | None = None


def _untruncated(pipeline: TextPipeline, text: str) -> int:
    return pipeline.untruncated([text])[0]


def _of_tokens(pipeline: TextPipeline, words: list[str], target: int) -> str:
    # The shortest prefix of ``words`` (repeated as needed) that tokenizes to >= target.
    def text(k: int) -> str:
        return " ".join(words[i % len(words)] for i in range(k))

    k = max(1, target // 2)
    while _untruncated(pipeline, text(k)) < target:
        k *= 2
    lo, hi = k // 2, k
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if _untruncated(pipeline, text(mid)) >= target:
            hi = mid
        else:
            lo = mid
    return text(hi)


def edge_texts(pipeline: TextPipeline) -> tuple[EdgeText, ...]:
    """The texts at the edges of the model ``pipeline`` reads (see the module docstring)."""
    from batchserve.engines.quality_set import load as load_quality_set

    items = [
        EdgeText(label="the empty string", text=""),
        EdgeText(label="a text with spaces around it", text="  spaces around this text  "),
        EdgeText(label="a text with a tab and a newline around it", text="\ttabbed text\n"),
        EdgeText(label="a one-word text", text="ok"),
    ]
    items += [EdgeText(label=f"a {name} text", text=text) for name, text in SCRIPTS]
    words = " ".join(load_quality_set().texts[-40:]).split()
    window = pipeline.window
    if window <= LONGEST:
        over = _of_tokens(pipeline, words, window + 16)
        items.append(
            EdgeText(
                label=f"a text longer than the window ({_untruncated(pipeline, over)} tokens, "
                f"window {window})",
                text=over,
            )
        )
    else:  # a window past LONGEST: a text past LONGEST, within it
        over = _of_tokens(pipeline, words, LONGEST + 16)
        items.append(
            EdgeText(
                label=f"a text of {_untruncated(pipeline, over)} tokens (window {window})",
                text=over,
            )
        )
    if window > 520:
        target = min(window - 8, 640)
        mid = _of_tokens(pipeline, words, target)
        items.append(
            EdgeText(
                label=f"a text of {_untruncated(pipeline, mid)} tokens (over 512, within the "
                f"window of {window})",
                text=mid,
            )
        )
    named = list(pipeline.prompts.prompts)
    for name in named:
        items.append(EdgeText(label=f"a query with prompt {name!r}", text=_QUERY, prompt_name=name))
    spoken = [n for n in named if pipeline.prompts.prompts[n]]
    if spoken:
        items.append(
            EdgeText(
                label=f"the empty string with prompt {spoken[0]!r}",
                text="",
                prompt_name=spoken[0],
            )
        )
    return tuple(items)


def inputs(items: Sequence[EdgeText], pipeline: TextPipeline) -> list[str]:
    """The engine's items for ``items``: the prompted texts as the routes make them."""
    return [apply_prompt([i.text], pipeline.prompts, i.prompt_name)[0] for i in items]


def _digest(items: Sequence[EdgeText]) -> str:
    h = hashlib.sha256()
    try:
        library = importlib.metadata.version("sentence-transformers")
    except importlib.metadata.PackageNotFoundError:
        library = "none"
    h.update(f"{_VERSION}\0{library}\0".encode())
    for item in items:
        h.update(f"{item.prompt_name}\0{item.text}\0".encode())
    return h.hexdigest()[:12]


def library_vectors(
    source: Path,
    items: Sequence[EdgeText],
    cache_dir: Path,
    *,
    library: Any = None,
) -> npt.NDArray[np.float32]:
    """``SentenceTransformer.encode``'s vectors of ``items``, computed once and cached.

    Blocks while the library loads the model (on the CPU, float32) and encodes them, the
    first time for this model, set and library version.

    Args:
        source: the model folder.
        items: the texts.
        cache_dir: the cache folder.
        library: a loaded ``SentenceTransformer`` of ``source`` at float32 to ask (the
            torch engine's own); None loads one.
    """
    path = model_folder(source, cache_dir) / "edges" / f"library-{_digest(items)}.npy"
    try:
        cached: npt.NDArray[np.float32] = np.load(path)
        if cached.shape[0] == len(items):
            return cached
    except (OSError, ValueError):
        pass  # missing or damaged: computed below
    if library is None:
        from batchserve.engines.embeddings import load_sentence_transformer

        library = load_sentence_transformer(source, device="cpu")
    groups: dict[str | None, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(item.prompt_name, []).append(i)
    out: npt.NDArray[np.float32] | None = None
    for name, rows in groups.items():
        vectors = np.asarray(
            library.encode(
                [items[i].text for i in rows],
                prompt_name=name,
                batch_size=1,
                convert_to_numpy=True,
                show_progress_bar=False,
            ),
            dtype=np.float32,
        )
        if out is None:
            out = np.zeros((len(items), vectors.shape[1]), dtype=np.float32)
        out[rows] = vectors
    assert out is not None
    buf = io.BytesIO()
    np.save(buf, out)
    write_cached(path, buf.getvalue())
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Edges:
    """An engine's figures on the edge texts, against the library.

    Attributes:
        texts: how many texts were compared.
        min_cosine: the smallest cosine of an engine's vector to the library's.
        worst: the label of that text.
        norm_error: the largest relative error of a vector's length.
        floor: the cosine every text must reach at this precision (None: not bounded).
        norm_bound: the length error every text must stay within (None: not bounded).
    """

    texts: int
    min_cosine: float
    worst: str
    norm_error: float
    floor: float | None
    norm_bound: float | None

    @property
    def passes(self) -> bool:
        """Whether every text is within the bounds."""
        return not self.failures()

    def failures(self) -> list[str]:
        """One phrase per bound missed, naming the text, the rule and the figure."""
        out = []
        if self.floor is not None and not self.min_cosine >= self.floor:
            out.append(
                f"cosine to sentence-transformers on {self.worst} must be >= {self.floor}, "
                f"got {self.min_cosine:.4f}"
            )
        if self.norm_bound is not None and not self.norm_error <= self.norm_bound:
            out.append(
                f"a vector's length must be within {self.norm_bound:.0e} of "
                f"sentence-transformers', got {self.norm_error:.2e} off"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values, with ``passes``."""
        return {
            "texts": self.texts,
            "min_cosine": self.min_cosine,
            "worst": self.worst,
            "norm_error": self.norm_error,
            "floor": self.floor,
            "norm_bound": self.norm_bound,
            "passes": self.passes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Edges:
        """Read back what :meth:`to_dict` wrote.

        Raises:
            KeyError: a field is missing.
        """
        floor, bound = data["floor"], data["norm_bound"]
        return cls(
            texts=int(data["texts"]),
            min_cosine=float(data["min_cosine"]),
            worst=str(data["worst"]),
            norm_error=float(data["norm_error"]),
            floor=None if floor is None else float(floor),
            norm_bound=None if bound is None else float(bound),
        )


def _row_cosines(
    got: npt.NDArray[np.float64], want: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    # Each row's cosine and relative length error; rows equal to the last bit (zero or
    # non-finite alike, as a masked-out max pooling gives) count as cosine 1.
    same = np.all((got == want) | (np.isnan(got) & np.isnan(want)), axis=1)
    with np.errstate(all="ignore"):
        g, w = np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1)
        cos = np.sum(got * want, axis=1) / (g * w)
        err = np.abs(g / w - 1.0)
    cos = np.where(same, 1.0, np.nan_to_num(cos, nan=0.0))
    err = np.where(same, 0.0, np.nan_to_num(err, nan=np.inf))
    return cos, err


def measure(
    items: Sequence[EdgeText],
    want: npt.NDArray[np.float32],
    candidate: Callable[[Sequence[str]], Any],
    pipeline: TextPipeline,
    dtype: str,
) -> Edges:
    """``candidate``'s figures on ``items`` against the library's vectors ``want``.

    Blocks for one pass of every item (the server's prompted texts, mixed lengths).
    """
    got = np.asarray(candidate(inputs(items, pipeline)), dtype=np.float32)
    return compare(items, want, got, dtype)


def compare(
    items: Sequence[EdgeText],
    want: npt.NDArray[np.float32],
    got: npt.NDArray[np.float32],
    dtype: str,
) -> Edges:
    """The figures of an engine's vectors ``got`` of ``items`` against the library's ``want``."""
    cos, err = _row_cosines(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64))
    worst = int(np.argmin(cos))
    return Edges(
        texts=len(items),
        min_cosine=float(cos[worst]),
        worst=items[worst].label,
        norm_error=float(np.max(err)) if len(err) else 0.0,
        floor=cosine_floor(dtype),
        norm_bound=norm_bound(dtype),
    )


def check(
    source: Path,
    engine: Engine,
    candidate: Callable[[Sequence[str]], Any],
    cache_dir: Path,
    *,
    library: Any = None,
) -> Edges:
    """``engine``'s figures on the edge texts of ``source`` (see the module docstring), cached.

    Blocks, the first time for this model and engine, for the library's vectors (see
    :func:`library_vectors`) and one pass of the engine.

    Args:
        source: the model folder.
        engine: the engine ``candidate`` runs (its name keys the figures).
        candidate: the engine's batch function.
        cache_dir: the cache folder.
        library: a loaded ``SentenceTransformer`` of ``source`` at float32 (None loads one).
    """
    pipeline = TextPipeline.read(source)
    items = edge_texts(pipeline)
    path = (
        model_folder(source, cache_dir)
        / "gate"
        / f"{engine.backend}-{engine.dtype}-edges-{_digest(items)}.json"
    )
    try:
        return Edges.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError):
        pass  # not measured yet (or damaged): measured below
    # The library's pass and the engine's run at once (each releases the GIL; on a CPU
    # each takes its own threads): the longest text costs the two passes' longer, not both.
    with ThreadPoolExecutor(2) as pool:
        asked = pool.submit(library_vectors, source, items, cache_dir, library=library)
        got = np.asarray(candidate(inputs(items, pipeline)), dtype=np.float32)
        want = asked.result()
    edges = compare(items, want, got, engine.dtype)
    write_cached(path, json.dumps(edges.to_dict(), indent=1).encode())
    _log.warning(
        "%s on the edge texts of %s: cosine to sentence-transformers >= %.6f over %d texts "
        "(worst: %s), vector lengths within %.1e: %s",
        engine,
        source.name,
        edges.min_cosine,
        edges.texts,
        edges.worst,
        edges.norm_error,
        "passed" if edges.passes else "FAILED (" + "; ".join(edges.failures()) + ")",
    )
    return edges
