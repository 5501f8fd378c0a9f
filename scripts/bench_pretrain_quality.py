"""Pretraining quality, measured: does the loop learn, and does scratchbert train like transformers' BERT?

Not a test (minutes of CPU). Two runs of the same loop (`scratchbert.training.pretraining.loop`) on
the shared real-text corpus (Moby-Dick + the King James Bible, ../shared/data/corpus):

  1. scratchbert's `ScratchBertForPreTraining`;
  2. transformers' `BertForPreTraining`, swapped in with the same seed, the same data and
     masks, and the same weights at step 0 (copied key for key from run 1's initial model:
     the two share BERT's state-dict names).

It reports held-out MLM and NSP accuracy against their chance levels (MLM: always guessing
the most frequent token; NSP: 0.5) and how closely the two training-loss curves agree, and
draws both into a PNG (default docs/pretraining_curves.png).

Budget (default): preset `tiny` (L2/H128), max_seq_length 64, batch 32, 250 steps, peak
learning rate 2e-3, an 8192-token vocabulary trained on the corpus: a few minutes per run on
2 idle CPU cores (the CPU is usually shared; the script prints the seconds it took).

    python scripts/bench_pretrain_quality.py [--steps 250] [--corpus ../shared/data/corpus] [--out docs/pretraining_curves.png]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import unittest.mock
from collections import Counter
from pathlib import Path

import torch
from accelerate.state import AcceleratorState
from transformers import BertConfig, BertForPreTraining

from scratchbert import ScratchBertConfig, ScratchBertForPreTraining
from scratchbert.training.pretraining import loop as pretrain_module
from scratchbert.training.pretraining.config import PretrainConfig
from scratchbert.training.pretraining.corpus import TOKENIZER_DIR
from scratchbert.training.pretraining.loop import LOG_FILE, pretrain
from scratchbert.training.pretraining.evaluation import finish_figure, read_log

REPO = Path(__file__).resolve().parents[1]


class TransformersBertForPreTraining(BertForPreTraining):
    """transformers' BERT with the one method scratchbert's evaluation calls on a model: `mlm_logits`."""

    def mlm_logits(self, hidden: torch.Tensor, labels: torch.Tensor | None):
        return self.cls.predictions(hidden), labels


def transformers_bert_with_scratchbert_init(config: BertConfig) -> BertForPreTraining:
    """transformers' BERT holding exactly the weights scratchbert's loop would start from.

    The scratchbert model is built first, drawing from torch's RNG as in run 1, so the
    RNG (dropout's stream) is left in the same state; transformers' model is built under
    `fork_rng` and then receives those weights.
    """
    fields = (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
        "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
        "initializer_range", "layer_norm_eps", "pad_token_id",
    )  # fmt: skip
    reference = ScratchBertForPreTraining(ScratchBertConfig(**{name: getattr(config, name) for name in fields}))
    with torch.random.fork_rng(devices=[]):
        model = TransformersBertForPreTraining(config)
    missing, unexpected = model.load_state_dict(reference.state_dict(), strict=False)
    if unexpected or [key for key in missing if "decoder" not in key]:  # the decoder is tied to the embeddings
        raise RuntimeError(f"state dicts differ: missing {missing}, unexpected {unexpected}")
    return model


def transformers_model(config: PretrainConfig, tokenizer, vocab_size: int) -> BertForPreTraining:
    """What the second run trains in place of `pretrain.build_model`'s model (swapped in by `main`)."""
    model_config = BertConfig(vocab_size=vocab_size, pad_token_id=tokenizer.pad_token_id, **config.model_kwargs())
    return transformers_bert_with_scratchbert_init(model_config)


def plot_loss_comparison(curves: dict[str, tuple[list[int], list[float]]], path: str | Path, title: str) -> Path:
    """Overlay several loss curves, `{label: (steps, losses)}`, e.g. two models trained identically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for (label, (steps, losses)), style in zip(curves.items(), ("-", "--", ":", "-.")):
        axis.plot(steps, losses, style, label=label)
    axis.set(xlabel="optimizer step", ylabel="training loss", title=title)
    return finish_figure(figure, [axis], path)



def mlm_chance(tokenizer, eval_texts: list[str]) -> float:
    """Accuracy of always predicting the most frequent non-special token of the held-out text."""
    counts = Counter()
    for text in eval_texts:
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return counts.most_common(1)[0][1] / max(sum(counts.values()), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "data" / "corpus"), help="folder of .txt files")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--out", default=str(REPO / "docs" / "pretraining_curves.png"))
    parser.add_argument("--work-dir", default=None, help="where the two runs are written (default: a temporary folder)")
    args = parser.parse_args()

    files = sorted(str(p) for p in Path(args.corpus).glob("*.txt"))
    if not files:
        raise SystemExit(f"no .txt files in {args.corpus}")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-pretrain-"))
    common = dict(
        recipe="paper",  # MLM + NSP: the two models compared are pretraining (BertForPreTraining) models
        preset=args.preset, train_files=files, max_steps=args.steps, max_seq_length=args.max_seq_length,
        batch_size=args.batch_size, learning_rate=args.learning_rate, warmup_ratio=0.1, eval_every=max(1, args.steps // 4),
        save_every=0, max_eval_examples=500,
        log_every=5, report_to="none", seed=0,
    )  # fmt: skip

    runs = {}
    first = pretrain(PretrainConfig(output_dir=str(work / "scratchbert"), overwrite=True, **common))
    runs["scratchbert ScratchBertForPreTraining"] = work / "scratchbert"
    # Same tokenizer (its training is not bit-reproducible across processes), data, seed, weights.
    AcceleratorState._reset_state(reset_partial_state=True)
    with unittest.mock.patch.object(pretrain_module, "build_model", transformers_model):
        pretrain(PretrainConfig(output_dir=str(work / "transformers"), overwrite=True, tokenizer=str(work / "scratchbert" / TOKENIZER_DIR), **common))
    runs["transformers BertForPreTraining"] = work / "transformers"

    curves, finals = {}, {}
    for label, folder in runs.items():
        records = read_log(folder / LOG_FILE)
        train = [r for r in records if r["type"] == "train"]
        curves[label] = ([r["step"] for r in train], [r["loss"] for r in train])
        finals[label] = {
            "first_eval": next(r for r in records if r["type"] == "eval"),
            "final": records[-1],
        }
    (steps, ours), (_, theirs) = curves.values()
    gaps = [abs(a - b) for a, b in zip(ours, theirs)]

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(work / "scratchbert")
    sample = Path(files[0]).read_text(encoding="utf-8")[:200_000].split("\n\n")
    chance = mlm_chance(tokenizer, sample)

    plot_loss_comparison(
        curves,
        args.out,
        title=f"{args.preset} BERT on Moby-Dick + KJV: same seed, data and step-0 weights",
    )
    summary = {
        "corpus": files,
        "steps": args.steps,
        "examples_per_step": args.batch_size,
        "max_seq_length": args.max_seq_length,
        "seconds_scratchbert_run": first.seconds,
        "mlm_accuracy_chance_most_frequent_token": chance,
        "nsp_accuracy_chance": 0.5,
        "runs": {
            label: {
                key: {k: round(v, 4) if isinstance(v, float) else v for k, v in value.items() if k in (
                    "step", "mlm_loss", "mlm_accuracy", "nsp_accuracy", "perplexity", "eval_examples", "seconds")}
                for key, value in result.items()
            }
            for label, result in finals.items()
        },
        "train_loss_gap_max": max(gaps),
        "train_loss_gap_mean": sum(gaps) / len(gaps),
        "train_loss_first_last": {label: (c[1][0], c[1][-1]) for label, c in curves.items()},
        "plot": str(args.out),
    }  # fmt: skip
    print(json.dumps(summary, indent=2))
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
