"""fill-mask and attention-map: the library functions, the pictures they draw, and the commands."""

from __future__ import annotations

import re

import matplotlib.image
import numpy as np
import pytest
import torch

import scratchbert.commands
from scratchbert import ScratchBertConfig, ScratchBertForPreTraining, ScratchBertModel
from scratchbert.inspection import (
    FIGURE_DPI,
    attention_weights,
    fill_mask,
    load_encoder,
    load_masked_lm,
    load_tokenizer,
    plot_attention,
    save_figure,
)
from scratchbert.tokenization import train_tokenizer

TEXTS = [
    "the cat sat on the mat and the dog sat on the log",
    "a cat and a dog ran to the park on a sunny day",
    "the dog saw the cat and the cat saw the dog",
] * 5
HEADS = 4


def tiny_config(vocab_size: int) -> ScratchBertConfig:
    return ScratchBertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=64,
        max_position_embeddings=64,
    )


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A tiny pretraining checkpoint (MLM + NSP heads, random weights) saved with its tokenizer."""
    folder = tmp_path_factory.mktemp("tiny_mlm")
    tokenizer = train_tokenizer(TEXTS, vocab_size=60, min_frequency=1, show_progress=False, model_max_length=64)
    torch.manual_seed(0)
    ScratchBertForPreTraining(tiny_config(len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_encoder_checkpoint(tmp_path_factory):
    """A bare encoder (no MLM head) saved with the same kind of tokenizer."""
    folder = tmp_path_factory.mktemp("tiny_encoder")
    tokenizer = train_tokenizer(TEXTS, vocab_size=60, min_frequency=1, show_progress=False, model_max_length=64)
    torch.manual_seed(0)
    ScratchBertModel(tiny_config(len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_cli(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    """Run `scratchbert ARGV` through the real dispatcher and error handling, with only this module's commands."""
    code = scratchbert.commands.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------------------
# fill-mask
# --------------------------------------------------------------------------------------


def test_fill_mask_ranks_the_softmax_at_each_mask(tiny_checkpoint):
    model, tokenizer = load_masked_lm(tiny_checkpoint)
    text = "the cat [MASK] on the [MASK]"
    predictions = fill_mask(model, tokenizer, text, top_k=3)
    assert len(predictions) == 2  # one ranking per [MASK]

    encoding = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        probs = model(**encoding).logits[0].softmax(-1)  # (S, V)
    mask_positions = (encoding["input_ids"][0] == tokenizer.mask_token_id).nonzero().flatten().tolist()
    for ranked, position in zip(predictions, mask_positions):
        assert len(ranked) == 3
        values = [p for _, p in ranked]
        assert values == sorted(values, reverse=True)
        expected = probs[position].topk(3)
        assert [token for token, _ in ranked] == tokenizer.convert_ids_to_tokens(expected.indices.tolist())
        assert values == pytest.approx(expected.values.tolist(), abs=1e-6)


def test_fill_mask_cli_prints_top_k_tokens_with_probabilities(tiny_checkpoint, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "fill-mask", "the dog [MASK] the cat", "--model", str(tiny_checkpoint), "--top-k", "4")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "[MASK] 1 of 1:"
    rows = [re.fullmatch(r"\s+(\d+)\. (\S+)\s+(\d\.\d{4})", line) for line in lines[1:]]
    assert len(rows) == 4 and all(rows), out
    assert [int(row.group(1)) for row in rows] == [1, 2, 3, 4]
    probabilities = [float(row.group(3)) for row in rows]
    assert probabilities == sorted(probabilities, reverse=True)
    assert 0 < sum(probabilities) <= 1.0001

    model, tokenizer = load_masked_lm(tiny_checkpoint)
    expected = fill_mask(model, tokenizer, "the dog [MASK] the cat", top_k=4)[0]
    assert [row.group(2) for row in rows] == [token for token, _ in expected]


def test_fill_mask_with_real_weights_completes_a_reaction(rxnfp_dir, monkeypatch, capsys):
    # rxnfp's MLM head was pretrained on reaction SMILES: in acetic acid's carbonyl, C(=O),
    # the masked bond can only be "=".
    code, out, err = run_cli(monkeypatch, capsys, "fill-mask", "C C ( [MASK] O ) O C C", "--model", str(rxnfp_dir), "--top-k", "2")
    assert code == 0, err
    first = re.fullmatch(r"\s+1\. (\S+)\s+(\d\.\d{4})", out.splitlines()[1])
    assert first.group(1) == "="
    assert float(first.group(2)) > 0.9


def test_fill_mask_without_mask_is_a_one_line_error(tiny_checkpoint, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "fill-mask", "no blank here", "--model", str(tiny_checkpoint))
    assert code == 2
    assert "no [MASK] in the text" in err and "Traceback" not in err
    assert out == ""


def test_fill_mask_refuses_a_checkpoint_without_mlm_head(tiny_encoder_checkpoint, monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "fill-mask", "the [MASK] sat", "--model", str(tiny_encoder_checkpoint))
    assert code == 2
    assert "no trained masked-language-model head" in err


@pytest.mark.parametrize("argv_tail", [["--top-k", "0"]], ids=["top-k-0"])
def test_fill_mask_rejects_bad_top_k(tiny_checkpoint, monkeypatch, capsys, argv_tail):
    code, _, err = run_cli(monkeypatch, capsys, "fill-mask", "the [MASK] sat", "--model", str(tiny_checkpoint), *argv_tail)
    assert code == 2 and "top_k=0" in err


def test_missing_model_folder_is_a_clear_error(tmp_path, monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "fill-mask", "a [MASK]", "--model", str(tmp_path / "nowhere"))
    assert code == 2 and "no such model folder" in err
    code, _, err = run_cli(monkeypatch, capsys, "attention-map", "a b", "--model", str(tmp_path), "--out", str(tmp_path / "a.png"))
    assert code == 2 and "has no config.json" in err


def test_tokenizer_casing_is_inferred_from_a_bare_vocab(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Cl", "C", "O"]) + "\n")
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.tokenize("Cl O") == ["Cl", "O"]  # a cased vocabulary: case kept
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cl", "o"]) + "\n")
    assert load_tokenizer(tmp_path).tokenize("Cl O") == ["cl", "o"]  # uncased: input lowercased


# --------------------------------------------------------------------------------------
# attention-map
# --------------------------------------------------------------------------------------


def image_panels(figure):
    """The heatmap axes of a figure (the colour bar holds no image)."""
    return [ax for ax in figure.axes if ax.images]


def test_attention_weights_are_the_models_own(tiny_checkpoint):
    model, tokenizer = load_encoder(tiny_checkpoint)
    tokens, weights = attention_weights(model, tokenizer, "the cat sat on the mat", layer=1)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert weights.shape == (HEADS, len(tokens), len(tokens))
    torch.testing.assert_close(weights.sum(-1), torch.ones(HEADS, len(tokens)))  # each query's weights sum to 1

    encoding = tokenizer("the cat sat on the mat", return_tensors="pt")
    with torch.no_grad():
        expected = model(**encoding, output_attentions=True).attentions[1][0]
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(attention_weights(model, tokenizer, "the cat sat on the mat", layer=-1)[1], expected)
    with pytest.raises(ValueError, match="numbered 0 to 1"):
        attention_weights(model, tokenizer, "the cat", layer=2)


@pytest.mark.parametrize("heads", [1, 4, 5, 12])
def test_plot_attention_draws_one_labelled_panel_per_head(heads):
    tokens = ["[CLS]", "a", "b", "c", "[SEP]"]
    weights = torch.rand(heads, 5, 5).softmax(-1)
    figure = plot_attention(tokens, weights)
    panels = image_panels(figure)
    assert len(panels) == heads  # unused grid cells are removed
    assert [ax.get_title() for ax in panels] == [f"head {h}" for h in range(heads)]
    for head, ax in enumerate(panels):
        np.testing.assert_allclose(ax.images[0].get_array(), weights[head].numpy())  # head h drawn in panel h
        assert [label.get_text() for label in ax.get_xticklabels()] == tokens
        assert [label.get_text() for label in ax.get_yticklabels()] == tokens


def test_plot_attention_rejects_mismatched_tokens():
    with pytest.raises(ValueError, match="3 tokens"):
        plot_attention(["a", "b", "c"], torch.rand(2, 4, 4))
    with pytest.raises(ValueError, match="heads, tokens, tokens"):
        plot_attention(["a"], torch.rand(4, 4))


def test_attention_map_cli_writes_a_real_picture(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    out = tmp_path / "attention.png"
    text = "the dog saw the cat on the mat"
    code, stdout, err = run_cli(monkeypatch, capsys, "attention-map", text, "--model", str(tiny_checkpoint), "--layer", "0", "--out", str(out))
    assert code == 0, err
    assert f"wrote {out}: layer 0, {HEADS} heads" in stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    model, tokenizer = load_encoder(tiny_checkpoint)
    tokens, weights = attention_weights(model, tokenizer, text, layer=0)
    figure = plot_attention(tokens, weights)
    assert len(image_panels(figure)) == HEADS

    pixels = matplotlib.image.imread(out)  # (height, width, channels), floats in [0, 1]
    width, height = (figure.get_size_inches() * FIGURE_DPI).round().astype(int)
    assert pixels.shape[:2] == (height, width)
    assert width >= 400 and height >= 300
    rgb = pixels[..., :3]
    assert rgb.std() > 0.05  # not a blank page
    colours = np.unique((rgb.reshape(-1, 3) * 255).round().astype(np.uint8), axis=0)
    assert len(colours) > 50  # heatmap shades, text and the colour bar, not a flat fill


def test_attention_map_cli_rejects_a_missing_layer_and_folder(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    out = tmp_path / "a.png"
    code, _, err = run_cli(monkeypatch, capsys, "attention-map", "the cat", "--model", str(tiny_checkpoint), "--layer", "5", "--out", str(out))
    assert code == 2 and "layer 5 does not exist" in err
    assert not out.exists()
    code, _, err = run_cli(
        monkeypatch, capsys, "attention-map", "the cat", "--model", str(tiny_checkpoint), "--out", str(tmp_path / "missing" / "a.png")
    )
    assert code == 2 and "does not exist; create it first" in err


def test_save_figure_writes_the_requested_file(tmp_path):
    figure = plot_attention(["a", "b"], torch.eye(2)[None])
    assert save_figure(figure, tmp_path / "one.png").stat().st_size > 1000


def test_checkpoint_without_tokenizer_is_a_clear_error(tmp_path):
    torch.manual_seed(0)
    ScratchBertForPreTraining(tiny_config(60)).save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="has no tokenizer.*tokenizer.save_pretrained"):
        load_masked_lm(tmp_path)


def test_saved_tokenizer_is_loaded_as_saved(tiny_checkpoint):
    _, tokenizer = load_masked_lm(tiny_checkpoint)
    assert type(tokenizer).__name__ == "ScratchBertTokenizer"
    assert tokenizer.mask_token == "[MASK]" and tokenizer.pad_token_id == 0
