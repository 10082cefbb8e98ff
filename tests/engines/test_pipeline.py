"""The text pipeline: pooling, projections and prompts as sentence-transformers computes them.

The pooling is held to the library's own ``Pooling`` module on random token embeddings of
padded passes (right and left padding, prompts kept out), every mode alone and combined; the
``Dense`` projection to the library's ``Dense`` for every activation it loads; and the
folder's reading to what the library reads, including the refusals of what no engine runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

import torch
from sentence_transformers.sentence_transformer import modules

from batchserve.engines.pipeline import TextPipeline
from batchserve.engines.pooling import POOLING_MODES, DenseLayer, prompt_mask
from batchserve.errors import ConfigError
from batchserve.models.kinds import PromptedText, Prompts, apply_prompt
from engine_fixtures import Zoo


def pipeline(modes: tuple[str, ...], steps: tuple[Any, ...] = (), dim: int = 8) -> TextPipeline:
    return TextPipeline(
        folder=Path("unused"),
        layout="modules.json",
        tokenizer=SimpleNamespace(padding_side="right"),
        window=64,
        lower_case=False,
        pooling_modes=modes,
        include_prompt=False,
        steps=steps,
        dimension=dim * len(modes),
        prompts=Prompts(prompts={}),
    )


def padded(lengths: list[int], width: int, *, left: bool) -> np.ndarray:
    mask = np.zeros((len(lengths), width), dtype=np.int64)
    for row, n in enumerate(lengths):
        if left:
            mask[row, width - n :] = 1
        else:
            mask[row, :n] = 1
    return mask


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
@pytest.mark.parametrize("prompt", [0, 3])
@pytest.mark.parametrize("modes", [(m,) for m in POOLING_MODES] + [("cls", "mean", "max")])
def test_pooling_is_the_librarys(left: bool, prompt: int, modes: tuple[str, ...]) -> None:
    rng = np.random.default_rng(len(modes) + 7 * prompt + left)
    lengths = [9, 4, 7, 12]
    mask = padded(lengths, 12, left=left)
    tokens = rng.normal(size=(4, 12, 8)).astype(np.float32)
    library = modules.Pooling(8, pooling_mode=modes if len(modes) > 1 else modes[0],
                              include_prompt=not prompt)  # fmt: skip
    features: dict[str, Any] = {
        "token_embeddings": torch.from_numpy(tokens),
        "attention_mask": torch.from_numpy(mask),
    }
    if prompt:
        features["prompt_length"] = prompt
    want = library(features)["sentence_embedding"].numpy()
    ours: dict[str, Any] = {"attention_mask": mask}
    if prompt:  # one prompt length per row: here, the library's one for every row
        ours["pooling_mask"] = prompt_mask(mask, [prompt] * 4)
    got = pipeline(modes).pool(tokens, ours)
    assert got.shape == want.shape
    assert np.allclose(got, want, atol=1e-5)


def test_a_prompt_is_kept_out_of_its_own_row_only() -> None:
    mask = padded([5, 3, 6], 6, left=True)
    out = prompt_mask(mask, [2, 0, 1])
    assert out.tolist() == [
        [0, 0, 0, 1, 1, 1],  # one pad, two prompt tokens
        [0, 0, 0, 1, 1, 1],  # no prompt
        [0, 1, 1, 1, 1, 1],  # one prompt token, no pad
    ]
    assert mask.sum() == 14  # the attention mask itself is left as it was


@pytest.mark.parametrize(
    "activation",
    [torch.nn.Tanh(), torch.nn.Identity(), torch.nn.ReLU(), torch.nn.GELU(),
     torch.nn.GELU(approximate="tanh"), torch.nn.Sigmoid(), torch.nn.SiLU()],
    ids=lambda a: repr(a),
)  # fmt: skip
@pytest.mark.parametrize("residual", [False, True])
def test_a_dense_projection_is_the_librarys(
    activation: torch.nn.Module, residual: bool, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    dense = modules.Dense(8, 5, activation_function=activation, use_residual=residual)
    dense.save(str(tmp_path))
    from batchserve.engines.pipeline import _dense

    layer, out = _dense(tmp_path)
    assert out == 5
    # what the library computes with the folder (it keeps the activation's class alone:
    # GELU's tanh approximation comes back exact)
    library = modules.Dense.load(str(tmp_path))
    x = np.random.default_rng(1).normal(size=(3, 8)).astype(np.float32)
    want = library({"sentence_embedding": torch.from_numpy(x)})["sentence_embedding"]
    assert isinstance(layer, DenseLayer)
    assert np.allclose(layer(x), want.detach().numpy(), atol=1e-5)


def test_an_activation_no_engine_runs_is_refused_by_name(tmp_path: Path) -> None:
    modules.Dense(8, 5, activation_function=torch.nn.Softplus()).save(str(tmp_path))
    from batchserve.engines.pipeline import _dense

    with pytest.raises(ConfigError, match="activation Softplus is not one batchserve runs"):
        _dense(tmp_path)


def test_pooling_then_dense_then_normalize_in_the_folders_order() -> None:
    rng = np.random.default_rng(3)
    weight = rng.normal(size=(4, 8)).astype(np.float32)
    layer = DenseLayer(weight=weight, bias=None, activation="identity")
    tokens = rng.normal(size=(2, 5, 8)).astype(np.float32)
    mask = padded([5, 2], 5, left=False)
    projected = pipeline(("mean",), (layer,)).pool(tokens, {"attention_mask": mask})
    mean = (tokens * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
    assert np.allclose(projected, mean @ weight.T, atol=1e-5)
    unit = pipeline(("mean",), (layer, "normalize")).pool(tokens, {"attention_mask": mask})
    assert np.allclose(np.linalg.norm(unit, axis=1), 1.0)
    assert not pipeline(("mean",), ("normalize", layer)).normalized  # a Dense after it


def test_a_prompted_text_is_the_joined_string_and_knows_its_prompt() -> None:
    prompts = Prompts(prompts={"query": "query: ", "document": ""}, default="query")
    [asked] = apply_prompt(["capital of France"], prompts, None)
    assert asked == "query: capital of France"
    assert isinstance(asked, PromptedText)
    assert (asked.prompt, asked.text) == ("query: ", "capital of France")
    assert hash(asked) == hash("query: capital of France")
    import pickle

    again = pickle.loads(pickle.dumps(asked))
    assert (again, again.prompt) == (asked, "query: ")
    # an empty prompt is no prompt, as encode() has it
    [plain] = apply_prompt(["x"], prompts, "document")
    assert not isinstance(plain, PromptedText)


def test_the_window_is_read_where_each_version_wrote_it(zoo: Zoo, tmp_path: Path) -> None:
    # sentence-transformers 6: the tokenizer's model_max_length (not sentence_bert_config)
    modern = zoo.folder("modernbert-8192")
    assert "max_seq_length" not in json.loads((modern / "sentence_bert_config.json").read_text())
    assert TextPipeline.read(modern).window == 8192
    # 2 to 5: sentence_bert_config.json's max_seq_length, over the tokenizer's
    legacy = zoo.folder("distilbert-mean-legacy")
    assert json.loads((legacy / "tokenizer_config.json").read_text())["model_max_length"] == 64
    read = TextPipeline.read(legacy)
    assert (read.window, read.lower_case, read.layout) == (64, True, "modules.json")
    # a bare save_pretrained: the tokenizer's, capped at the position embeddings
    bare = TextPipeline.read(zoo.folder("xlmr-bare"))
    assert (bare.window, bare.layout, bare.pooling, bare.normalized) == (
        512, "save_pretrained", "mean", False,
    )  # fmt: skip


def test_a_module_no_engine_runs_is_refused_naming_it(zoo: Zoo, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "odd"
    shutil.copytree(zoo.folder("distilbert-mean-legacy"), folder)
    listed = json.loads((folder / "modules.json").read_text())
    listed.append({"idx": 3, "name": "3", "path": "3_LayerNorm",
                   "type": "sentence_transformers.models.LayerNorm"})  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(listed))
    with pytest.raises(ConfigError, match="module 3 is LayerNorm at 3_LayerNorm, which batchserve"):
        TextPipeline.read(folder)
    (folder / "modules.json").write_text(json.dumps(listed[:1]))
    with pytest.raises(ConfigError, match="has no Pooling module"):
        TextPipeline.read(folder)


def test_a_folder_the_library_renders_as_chat_is_tokenized_by_it_on_torch_alone(
    tmp_path: Path, engine_cache: Path
) -> None:
    # A bare Qwen3 folder whose tokenizer has a chat template: sentence-transformers 6
    # renders every text through it (the "message" modality).
    from sentence_transformers import SentenceTransformer

    import zoo
    from batchserve.engines.loader import load_model

    spec = zoo.Spec(name="qwen3-chat", family="qwen3", layout="bare", window=256)
    tokenizer = zoo.tokenizer_of(spec)
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}"
    )
    folder = tmp_path / spec.name
    zoo.model_of(spec, tokenizer).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    assert TextPipeline.read(folder).renders_messages
    texts = ["a text", "  spaces around  ", "another, longer text than the others"]
    want = SentenceTransformer(str(folder), device="cpu").encode(texts)
    model = load_model(f"{folder}:backend=torch,threads=1")
    got = np.asarray(model.fn(texts))
    cos = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert np.all(cos >= 0.9999)
    with pytest.raises(ConfigError, match="renders qwen3-chat's texts through its chat template"):
        load_model(f"{folder}:backend=onnx,cache_dir={engine_cache}")
