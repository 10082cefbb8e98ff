"""An LLM reranker folder (Qwen3-Reranker's shape) with random weights, and its card's recipe.

:func:`build` makes a random-weight ``Qwen3ForCausalLM`` (two 32-wide layers unless told
otherwise) with a byte-level BPE tokenizer trained here on the shipped texts (Qwen's special
tokens, ``<think>`` and ``</think>``, and ``yes`` and ``no`` single tokens), saved with
``save_pretrained`` and a ``batchserve_reranker.json`` naming the ``qwen3`` template.
:class:`Reference` is the model card's recipe with transformers, one pair at a time: what
the served scores must equal (the tests), and the yardstick the benchmark states its ratio
against.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

#: The card's prompt, word for word.
PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
#: The same prompt as a chat template of the ``query`` and ``document`` roles, as
#: sentence-transformers' ``CrossEncoder`` renders a pair through it (Jinja drops the file's
#: last newline: the suffix's two are kept).
CHAT_TEMPLATE = (
    PREFIX
    + f"<Instruct>: {INSTRUCTION}\n"
    + '<Query>: {{ messages | selectattr("role", "eq", "query") | map(attribute="content") '
    + "| first }}\n"
    + '<Document>: {{ messages | selectattr("role", "eq", "document") '
    + '| map(attribute="content") | first }}'
    + SUFFIX
    + "\n"
)


__all__ = ["CHAT_TEMPLATE", "INSTRUCTION", "PREFIX", "SUFFIX", "Reference", "build", "tokenizer"]


def tokenizer() -> Any:
    """Qwen's kind of tokenizer: byte-level BPE, no special tokens added, padded on the left."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from batchserve.engines.quality_set import load

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    answers = ["yes", "no", "yes no", "no yes"] * 200
    tok.train_from_iterator(
        [*load().texts[:600], *answers, PREFIX, SUFFIX, INSTRUCTION],
        trainers.BpeTrainer(
            vocab_size=900,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    eos = "<|endoftext|>"
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        model_max_length=32768,
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
        eos_token=eos,
        pad_token=eos,
    )
    for word in ("yes", "no"):
        assert len(fast.encode(word, add_special_tokens=False)) == 1, word
    return fast


def build(
    root: Path,
    *,
    name: str = "llm-reranker",
    template: Any = None,
    width: int = 32,
    layers: int = 2,
    chat_template: bool = False,
) -> Path:
    """An LLM reranker folder under ``root`` (a second or so at the default size).

    Args:
        root: where to make it.
        name: the folder's name.
        template: what ``batchserve_reranker.json`` holds (None: ``{"template": "qwen3"}``;
            ``False``: no such file, an undeclared causal LM).
        width: the hidden size (heads of 16; one key-value head per two).
        layers: the decoder layers.
        chat_template: write :data:`CHAT_TEMPLATE` as the folder's ``chat_template.jinja``.

    Returns:
        The folder's path.
    """
    import torch
    import transformers as tf

    folder = root / name
    tok = tokenizer()
    torch.manual_seed(41)
    config = tf.Qwen3Config(
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=width // 16,
        num_key_value_heads=max(1, width // 32),
        head_dim=16,
        intermediate_size=2 * width,
        vocab_size=len(tok),
        max_position_embeddings=32768,
        initializer_range=0.2,
        tie_word_embeddings=True,
        pad_token_id=None,
    )
    model: Any = tf.Qwen3ForCausalLM(config)
    model.eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    if chat_template:
        (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    if template is not False:
        body = {"template": "qwen3"} if template is None else template
        (folder / "batchserve_reranker.json").write_text(json.dumps(body), encoding="utf-8")
    return folder


class Reference:
    """The card's recipe, in-process: its tokenizer, model and scoring, one pair at a time."""

    def __init__(self, folder: Path, max_length: int = 8192) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), padding_side="left")
        model: Any = AutoModelForCausalLM.from_pretrained(str(folder))
        model.eval()
        self.model = model
        self.yes = self.tokenizer.convert_tokens_to_ids("yes")
        self.no = self.tokenizer.convert_tokens_to_ids("no")
        self.prefix = self.tokenizer.encode(PREFIX, add_special_tokens=False)
        self.suffix = self.tokenizer.encode(SUFFIX, add_special_tokens=False)
        self.max_length = max_length

    def __call__(self, query: str, document: str) -> float:
        """P(yes) for one pair, as the card computes it."""
        import torch

        text = f"<Instruct>: {INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
        inputs = self.tokenizer(
            [text],
            padding=False,
            truncation="longest_first",
            return_attention_mask=False,
            max_length=self.max_length - len(self.prefix) - len(self.suffix),
        )
        for i, ele in enumerate(inputs["input_ids"]):
            inputs["input_ids"][i] = self.prefix + ele + self.suffix
        with warnings.catch_warnings():  # the card passes max_length to pad, which ignores it
            warnings.simplefilter("ignore", UserWarning)
            batch = self.tokenizer.pad(
                inputs, padding=True, return_tensors="pt", max_length=self.max_length
            )
        with torch.no_grad():
            scores = self.model(**batch).logits[:, -1, :]
            pair = torch.stack([scores[:, self.no], scores[:, self.yes]], dim=1)
            return float(torch.nn.functional.log_softmax(pair, dim=1)[:, 1].exp()[0])
