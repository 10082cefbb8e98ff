"""The zoo: tiny random-weight embedding folders of each family, pooling and file layout.

Each folder is what a user brings, made offline in a second or so: a transformer of two
32-wide layers with random weights (seeded), a tokenizer trained here with the
``tokenizers`` library on the shipped texts (WordPiece for BERT and MPNet, byte-level BPE
for RoBERTa, ModernBERT and Qwen, Unigram for XLM-R), saved as sentence-transformers 6
saves it (``SentenceTransformer.save``), as versions 2 to 5 laid it out
(``sentence_bert_config.json`` with ``max_seq_length``, ``pooling_mode_*_token`` flags), or
as a bare ``save_pretrained``. Their vectors mean nothing, but they differ between texts,
and every engine must give the ones ``SentenceTransformer.encode`` gives.

:data:`ZOO` lists them; :func:`build` makes one. The suite builds each once per session
(``engine_fixtures.zoo``).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Texts in many scripts beside the shipped set, so every tokenizer learns some of them.
_MORE = [
    "机器学习让计算机从数据中学习规律。东京是日本的首都。",
    "東京は日本の首都で、とても大きな都市です。",
    "서울은 대한민국의 수도입니다.",
    "اللغة العربية تكتب من اليمين إلى اليسار.",
    "Москва — столица России, большой город.",
    "ΟΔΟΣ Αθηνάς: η οδός της Αθήνας.",
    "नमस्ते दुनिया, यह एक परीक्षण वाक्य है।",
    "Die Straße führt über die Brücke.",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Spec:
    """One folder of the zoo.

    Attributes:
        name: the folder's name.
        family: ``bert``, ``distilbert``, ``roberta``, ``xlmr``, ``mpnet``, ``modernbert``,
            ``qwen2`` or ``qwen3`` (a decoder's base model; a bare ``...ForCausalLM`` is refused
            at start, ``tests/models/test_kinds.py``).
        layout: ``st6`` (``SentenceTransformer.save``), ``legacy`` (files as versions 2 to 5
            wrote them) or ``bare`` (``save_pretrained`` alone).
        pooling: the pooling mode (``bare``: what sentence-transformers picks).
        include_prompt: the pooling config's ``include_prompt``.
        dense: a ``Dense`` module to this many features (Tanh), or None.
        normalize: a ``Normalize`` module last.
        prompts: the named prompts.
        default_prompt: the default prompt's name.
        window: the window (``max_seq_length``), where the layout states it.
        lower_case: ``do_lower_case`` (with a cased tokenizer, so that it tells).
    """

    name: str
    family: str
    layout: str
    pooling: str = "mean"
    include_prompt: bool = True
    dense: int | None = None
    normalize: bool = True
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None
    window: int | None = None
    lower_case: bool = False

    @property
    def normalized(self) -> bool:
        """Whether its vectors are unit length."""
        return self.normalize and self.layout != "bare"


_QUERY = {"query": "query: ", "passage": "passage: "}
_INSTRUCT = {
    "query": "Instruct: Given a web search query, retrieve relevant passages\nQuery: ",
    "document": "",
}

#: Every family, every pooling, a Dense, prompts with and without include_prompt, every
#: layout, an 8,192-token window.
ZOO: tuple[Spec, ...] = (
    Spec(name="bert-cls", family="bert", layout="st6", pooling="cls", prompts=_QUERY,
         default_prompt="query", window=128),
    Spec(name="distilbert-mean-legacy", family="distilbert", layout="legacy", window=64,
         lower_case=True),
    Spec(name="roberta-max", family="roberta", layout="st6", pooling="max", normalize=False),
    Spec(name="xlmr-bare", family="xlmr", layout="bare"),
    Spec(name="mpnet-weightedmean-dense", family="mpnet", layout="st6", pooling="weightedmean",
         dense=16),
    Spec(name="modernbert-8192", family="modernbert", layout="st6", prompts=_QUERY),
    Spec(name="qwen3-lasttoken", family="qwen3", layout="st6", pooling="lasttoken",
         prompts=_INSTRUCT, window=1024),
    Spec(name="qwen2-mean-prompt-excluded", family="qwen2", layout="st6", include_prompt=False,
         prompts=_QUERY, default_prompt="query", normalize=False, window=1024),
    Spec(name="bert-instructor-legacy", family="bert", layout="legacy",
         pooling="mean_sqrt_len_tokens", include_prompt=False, prompts=_QUERY, window=96),
    Spec(name="qwen2-bare", family="qwen2", layout="bare", window=2048),
)  # fmt: skip


def _corpus() -> list[str]:
    from batchserve.engines.quality_set import load

    return [*load().texts[:600], *_MORE]


def _fast(tok: Any, *, window: int, padding_side: str = "right", **specials: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        model_max_length=window,
        padding_side=padding_side,
        model_input_names=["input_ids", "attention_mask"],
        **specials,
    )


def wordpiece(*, lowercase: bool, cls: str, sep: str, window: int, bert: bool = True) -> Any:
    """A WordPiece tokenizer trained on the shipped texts (BERT's or, ``bert=False``, MPNet's)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    pad, unk, mask = ("[PAD]", "[UNK]", "[MASK]") if bert else ("<pad>", "<unk>", "<mask>")
    specials = [cls, pad, sep, unk, mask] if not bert else [pad, unk, cls, sep, mask]
    tok = Tokenizer(models.WordPiece(unk_token=unk))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        _corpus(),
        trainers.WordPieceTrainer(vocab_size=900, special_tokens=specials, show_progress=False),
    )
    ids = [(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=ids
    )
    fast = _fast(tok, window=window, unk_token=unk, pad_token=pad, cls_token=cls,
                 sep_token=sep, mask_token=mask)  # fmt: skip
    if bert:
        fast.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    return fast


def byte_bpe(*, kind: str, window: int) -> Any:
    """A byte-level BPE tokenizer: RoBERTa's (``<s> $A </s>``), ModernBERT's or Qwen's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if kind == "qwen":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    elif kind == "modernbert":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    else:
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        _corpus(),
        trainers.BpeTrainer(
            vocab_size=900,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    if kind == "qwen":  # no BOS; an end-of-text token closes each text; left padding
        eos = "<|endoftext|>"
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A {eos}",
            pair=f"$A {eos} $B:1 {eos}:1",
            special_tokens=[(eos, tok.token_to_id(eos))],
        )
        return _fast(tok, window=window, padding_side="left", eos_token=eos, pad_token=eos)
    first, last = ("[CLS]", "[SEP]") if kind == "modernbert" else ("<s>", "</s>")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}",
        pair=f"{first} $A {last} $B:1 {last}:1",
        special_tokens=[(first, tok.token_to_id(first)), (last, tok.token_to_id(last))],
    )
    if kind == "modernbert":
        return _fast(tok, window=window, pad_token="[PAD]", unk_token="[UNK]",
                     cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")  # fmt: skip
    return _fast(tok, window=window, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                 unk_token="<unk>", mask_token="<mask>")  # fmt: skip


def unigram(*, window: int) -> Any:
    """A Unigram tokenizer over SentencePiece's metaspace, as XLM-R's (``<s> $A </s>``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        _corpus(),
        trainers.UnigramTrainer(
            vocab_size=900, special_tokens=specials, unk_token="<unk>", show_progress=False
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))],
    )
    return _fast(tok, window=window, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                 unk_token="<unk>", mask_token="<mask>")  # fmt: skip


def tokenizer_of(spec: Spec) -> Any:
    """``spec``'s tokenizer, trained here (its family's kind, its window)."""
    window = spec.window or 512
    if spec.family in ("bert", "distilbert"):
        return wordpiece(lowercase=not spec.lower_case, cls="[CLS]", sep="[SEP]",
                         window=window, bert=spec.family == "bert")  # fmt: skip
    if spec.family == "mpnet":
        return wordpiece(lowercase=True, cls="<s>", sep="</s>", window=window, bert=False)
    if spec.family == "xlmr":
        return unigram(window=window)
    if spec.family == "modernbert":
        return byte_bpe(kind="modernbert", window=8192)
    if spec.family.startswith("qwen"):
        return byte_bpe(kind="qwen", window=spec.window or 32768)
    return byte_bpe(kind="roberta", window=window)


def model_of(spec: Spec, tokenizer: Any) -> Any:
    """``spec``'s transformer with random weights, seeded by its name."""
    import torch
    import transformers as tf

    torch.manual_seed(zlib.crc32(spec.name.encode()))
    vocab = len(tokenizer)
    pad = tokenizer.pad_token_id
    small: dict[str, Any] = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "vocab_size": vocab,
        "pad_token_id": pad,
        # Ten times the usual spread: at 0.02 a random CLS vector hardly depends on the text
        # (cosine 0.9999 between any two), so a wrong vector could pass the floor.
        "initializer_range": 0.2,
    }
    family = spec.family
    if family == "bert":
        return tf.BertModel(tf.BertConfig(max_position_embeddings=512, **small))
    if family == "distilbert":
        return tf.DistilBertModel(
            tf.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                max_position_embeddings=512, pad_token_id=pad,
                                initializer_range=0.2)
        )  # fmt: skip
    if family in ("roberta", "xlmr", "mpnet"):
        # Positions start after the padding index: 512 tokens need 514 embeddings.
        config_cls = {"roberta": tf.RobertaConfig, "xlmr": tf.XLMRobertaConfig,
                      "mpnet": tf.MPNetConfig}[family]  # fmt: skip
        model_cls = {"roberta": tf.RobertaModel, "xlmr": tf.XLMRobertaModel,
                     "mpnet": tf.MPNetModel}[family]  # fmt: skip
        return model_cls(config_cls(max_position_embeddings=514, **small))
    if family == "modernbert":
        return tf.ModernBertModel(
            tf.ModernBertConfig(
                max_position_embeddings=8192,
                local_attention=16,  # its second layer attends to a sliding window
                cls_token_id=tokenizer.cls_token_id,
                sep_token_id=tokenizer.sep_token_id,
                bos_token_id=tokenizer.cls_token_id,
                eos_token_id=tokenizer.sep_token_id,
                # one head: its 8,208-token text costs half the attention of two
                **{**small, "num_attention_heads": 1},
            )
        )
    # No padding index: Qwen pads with its end-of-text token, whose embedding must be a
    # real one (the empty text is that token alone).
    qwen = {**small, "num_key_value_heads": 1, "max_position_embeddings": 32768,
            "pad_token_id": None}  # fmt: skip
    if family == "qwen3":
        return tf.Qwen3Model(tf.Qwen3Config(head_dim=16, **qwen))
    return tf.Qwen2Model(tf.Qwen2Config(**qwen))


def build(spec: Spec, root: Path) -> Path:
    """Make ``spec``'s folder under ``root`` (a second or so); returns its path."""
    folder = root / spec.name
    tokenizer = tokenizer_of(spec)
    model = model_of(spec, tokenizer).eval()
    if spec.layout == "st6":
        raw = root / f".{spec.name}-raw"
        model.save_pretrained(str(raw))
        tokenizer.save_pretrained(str(raw))
        _save_st6(spec, raw, folder)
        return folder
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    if spec.layout == "legacy":
        _write_legacy(spec, folder)
    return folder


def _save_st6(spec: Spec, raw: Path, folder: Path) -> None:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    transformer = models.Transformer(str(raw), max_seq_length=spec.window)
    dim = transformer.get_embedding_dimension()
    modules: list[Any] = [
        transformer,
        models.Pooling(dim, pooling_mode=spec.pooling, include_prompt=spec.include_prompt),
    ]
    if spec.dense is not None:
        modules.append(models.Dense(dim, spec.dense, activation_function=torch.nn.Tanh()))
    if spec.normalize:
        modules.append(models.Normalize())
    st = SentenceTransformer(
        modules=modules,
        device="cpu",
        prompts=dict(spec.prompts) or None,
        default_prompt_name=spec.default_prompt,
    )
    st.save(str(folder))


def _write_legacy(spec: Spec, folder: Path) -> None:
    # The files as sentence-transformers 2 to 5 wrote them: the old module paths, the
    # window in sentence_bert_config.json, one flag per pooling mode.
    def write(path: Path, data: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2), encoding="utf-8")

    old = "sentence_transformers.models"
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": f"{old}.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": f"{old}.Pooling"},
    ]
    if spec.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": f"{old}.Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    write(folder / "modules.json", modules)
    write(
        folder / "sentence_bert_config.json",
        {"max_seq_length": spec.window, "do_lower_case": spec.lower_case},
    )
    flags = {
        f"pooling_mode_{m}": spec.pooling == name
        for name, m in (
            ("cls", "cls_token"),
            ("mean", "mean_tokens"),
            ("max", "max_tokens"),
            ("mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
            ("weightedmean", "weightedmean_tokens"),
            ("lasttoken", "lasttoken"),
        )
    }
    write(
        folder / "1_Pooling" / "config.json",
        {"word_embedding_dimension": 32, **flags, "include_prompt": spec.include_prompt},
    )
    write(
        folder / "config_sentence_transformers.json",
        {
            "__version__": {"sentence_transformers": "2.7.0"},
            "prompts": spec.prompts,
            "default_prompt_name": spec.default_prompt,
        },
    )
