"""Look inside a trained BERT: fill in `[MASK]` tokens, and draw what every attention head looks at.

Two questions a reader of the model code soon asks of a real checkpoint:

* *What does the masked-language-model head believe?* `fill_mask` runs the checkpoint on a
  text with `[MASK]` tokens and ranks the vocabulary at each of them.
* *Where does each head attend?* `attention_weights` returns one layer's attention
  probabilities, (heads, tokens, tokens), and `plot_attention` draws them as a grid of
  heatmaps, one panel per head, queries down the side and keys along the bottom.

Both load any BERT checkpoint folder: one saved by scratchbert, or a transformers BERT
(`config.json` + weights), since scratchbert keeps BERT's parameter names. The command line
(`scratchbert fill-mask`, `scratchbert attention-map`, in `scratchbert/commands/`) is a thin
layer over these functions.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from transformers import PreTrainedModel

from scratchbert.errors import MissingFileError, ScratchBertError
from scratchbert.modeling_scratchbert import ScratchBertForMaskedLM, ScratchBertModel
from scratchbert.tokenization import MASK_TOKEN, check_vocabulary, load_tokenizer
from scratchbert.weights import check_weights, model_folder, quiet_loading

DEFAULT_TOP_K = 5
# Heatmap sizing: a panel grows with the number of tokens so their labels stay legible,
# within bounds that keep a 12-head figure a sensible image.
PANEL_INCHES_PER_TOKEN = 0.28
PANEL_INCHES_MIN, PANEL_INCHES_MAX = 3.0, 9.0
FIGURE_DPI = 100


# --------------------------------------------------------------------------------------
# Loading a checkpoint folder
# --------------------------------------------------------------------------------------


def _check_model_dir(model_dir: str | Path) -> Path:
    model_dir = model_folder(model_dir)
    check_weights(model_dir)  # a truncated or corrupt weight file: one line, before transformers reads it
    return model_dir


def load_masked_lm(model_dir: str | Path) -> tuple[ScratchBertForMaskedLM, object]:
    """A checkpoint's encoder and masked-language-model head, in eval mode, and its tokenizer.

    Raises ValueError when the checkpoint has no trained MLM head (a bare encoder such as a
    sentence-embedding model): its predictions would come from random weights.
    """
    model_dir = _check_model_dir(model_dir)
    with quiet_loading():
        model, info = ScratchBertForMaskedLM.from_pretrained(model_dir, output_loading_info=True)
    untrained = sorted(key for key in info["missing_keys"] if not key.startswith("cls.predictions.decoder"))
    if untrained:
        raise ScratchBertError(
            f"{model_dir} has no trained masked-language-model head (missing {', '.join(untrained[:3])}"
            f"{', ...' if len(untrained) > 3 else ''}): fill-mask needs a checkpoint pretrained with MLM, "
            f"e.g. one saved by `scratchbert pretrain`."
        )
    return model.eval(), _tokenizer_for(model, model_dir)


def _tokenizer_for(model: PreTrainedModel, model_dir: Path):
    tokenizer = load_tokenizer(model_dir, model.config.max_position_embeddings)
    check_vocabulary(model.config.vocab_size, tokenizer, model_dir)
    return tokenizer


def load_encoder(model_dir: str | Path) -> tuple[ScratchBertModel, object]:
    """A checkpoint's encoder (any head it carries is left out), in eval mode, and its tokenizer."""
    model_dir = _check_model_dir(model_dir)
    with quiet_loading():
        model, info = ScratchBertModel.from_pretrained(model_dir, output_loading_info=True)
    # The pooler plays no part in attention, and MLM-only checkpoints do not have one.
    missing = sorted(key for key in info["missing_keys"] if not key.startswith("pooler."))
    if missing:
        raise ScratchBertError(
            f"{model_dir} is not a complete BERT checkpoint: its weights lack {', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}."
        )
    return model.eval(), _tokenizer_for(model, model_dir)


# --------------------------------------------------------------------------------------
# Fill in the blanks
# --------------------------------------------------------------------------------------


@torch.no_grad()
def fill_mask(model: PreTrainedModel, tokenizer, text: str, top_k: int = DEFAULT_TOP_K) -> list[list[tuple[str, float]]]:
    """Rank the vocabulary at every `[MASK]` in `text`.

    All masks are predicted together, in one forward pass, each without knowing what the
    others will be (as in BERT's pretraining). Returns, for each `[MASK]` from left to right,
    the `top_k` (token, probability) pairs, most probable first.
    """
    if not isinstance(top_k, int) or top_k < 1:
        raise ScratchBertError(f"top_k={top_k!r}: ask for at least 1 prediction.")
    if tokenizer.mask_token_id is None:
        raise ScratchBertError("this tokenizer has no mask token, so there is nothing to fill in; use the checkpoint's BERT tokenizer.")
    max_length = model.config.max_position_embeddings
    encoding = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
    input_ids = encoding["input_ids"]  # (1, S)
    positions = (input_ids[0] == tokenizer.mask_token_id).nonzero().flatten()  # indices of [MASK]
    if len(positions) == 0:
        where = f" within the first {max_length} tokens" if MASK_TOKEN in text else ""
        raise ScratchBertError(f"no {MASK_TOKEN} in the text{where}: write {MASK_TOKEN} where a word should be predicted.")
    device = next(model.parameters()).device
    logits = model(**{name: tensor.to(device) for name, tensor in encoding.items()}).logits  # (1, S, V)
    probs = logits[0, positions].float().softmax(dim=-1)  # (masks, V)
    top = probs.topk(min(top_k, probs.size(-1)), dim=-1)
    return [
        [(tokenizer.convert_ids_to_tokens(int(index)), float(p)) for p, index in zip(values, indices)]
        for values, indices in zip(top.values, top.indices)
    ]


# --------------------------------------------------------------------------------------
# Attention pictures
# --------------------------------------------------------------------------------------


@torch.no_grad()
def attention_weights(model: ScratchBertModel, tokenizer, text: str, layer: int = -1) -> tuple[list[str], torch.Tensor]:
    """One layer's attention probabilities for `text`.

    `layer` counts from 0; negative values count from the last layer (-1 = last).
    Returns the tokens (S of them, special tokens included) and the weights, shape (A, S, S):
    `weights[h, i, j]` is how much token i (the query) draws from token j (the key) in head h.
    """
    num_layers = model.config.num_hidden_layers
    if not isinstance(layer, int) or not -num_layers <= layer < num_layers:
        raise ScratchBertError(
            f"layer {layer!r} does not exist: this model has {num_layers} layers, numbered 0 to {num_layers - 1} "
            "(or -1 for the last)."
        )
    encoding = tokenizer(text, truncation=True, max_length=model.config.max_position_embeddings, return_tensors="pt")
    device = next(model.parameters()).device
    output = model(**{name: tensor.to(device) for name, tensor in encoding.items()}, output_attentions=True)
    tokens = tokenizer.convert_ids_to_tokens(encoding["input_ids"][0].tolist())
    return tokens, output.attentions[layer][0].float().cpu()  # (A, S, S)


def plot_attention(tokens: list[str], weights: torch.Tensor, title: str | None = None) -> Figure:
    """Draw each head's (S, S) attention weights as one heatmap panel of a grid.

    weights: (A, S, S), rows are queries and columns keys, so every row sums to 1. All
    panels share one colour scale, 0 to 1, so heads can be compared by eye. Returns a
    matplotlib `Figure` (Agg canvas, no display needed) with one heatmap axes per head
    plus a colour bar.
    """
    if weights.dim() != 3 or weights.size(1) != weights.size(2):
        raise ValueError(f"weights must have shape (heads, tokens, tokens), got {tuple(weights.shape)}.")
    num_heads, seq, _ = weights.shape
    if len(tokens) != seq:
        raise ValueError(f"{len(tokens)} tokens given for attention weights over {seq} positions.")
    cols = math.ceil(math.sqrt(num_heads))
    rows = math.ceil(num_heads / cols)
    panel = min(max(PANEL_INCHES_MIN, PANEL_INCHES_PER_TOKEN * seq), PANEL_INCHES_MAX)
    label_size = max(4.0, min(9.0, 160 / seq))  # shrink the tick labels as the token count grows

    figure = Figure(figsize=(cols * panel + 1.5, rows * panel + 1.0), dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(figure)  # render off-screen: no display, works on servers and in tests
    cells = list(figure.subplots(rows, cols, squeeze=False).flat)
    panels = cells[:num_heads]
    for unused in cells[num_heads:]:  # the grid can have more cells than heads
        figure.delaxes(unused)
    for head, ax in enumerate(panels):
        image = ax.imshow(weights[head].numpy(), vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
        ax.set_title(f"head {head}", fontsize=10)
        ax.set_xticks(range(seq), tokens, rotation=90, fontsize=label_size)
        ax.set_yticks(range(seq), tokens, fontsize=label_size)
        ax.set_xlabel("key (attended to)", fontsize=8)
        ax.set_ylabel("query", fontsize=8)
    figure.colorbar(image, ax=panels, shrink=0.6, label="attention weight")
    if title:
        figure.suptitle(title)
    return figure


def save_figure(figure: Figure, out: str | Path) -> Path:
    """Write `figure` to `out` (format from the suffix, e.g. .png); the folder must exist."""
    out = Path(out)
    if not out.parent.is_dir():
        raise MissingFileError(f"cannot write {out}: the folder {out.parent} does not exist; create it first.")
    formats = figure.canvas.get_supported_filetypes()
    if out.suffix.lower().lstrip(".") not in formats:
        raise ScratchBertError(f"cannot write {out}: {out.suffix or 'no suffix'} is not an image format; end the name with .png, .svg or .pdf.")
    if not os.access(out.parent, os.W_OK):
        raise ScratchBertError(f"cannot write {out}: the folder {out.parent} is not writable; name a file in a folder you can write to.")
    figure.savefig(out, dpi=FIGURE_DPI)
    return out
