"""ELECTRA's replaced-token detection (`--objective electra`): the shared embeddings, the discriminator's
target, a short run that learns, what it saves (and that the saved models load, export and fine-tune),
exact resumption, old configurations and the option checks.

Every run here is a tiny model (hidden 32, 2 layers, 4 heads, a 1-layer generator) on a few documents
of the embedded corpus, for a handful of steps.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from conftest import TINY_PRETRAIN, documentation_corpus, run_config_maker, run_log, kill_after_saving, saved_tokenizer

from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM, ScratchBertModel
from scratchbert.commands import main
from scratchbert.errors import ScratchBertError
from scratchbert.modeling_scratchbert import IGNORE_INDEX
from scratchbert.training import checkpoint as ckpt
from scratchbert.training import electra
from scratchbert.training.config import PretrainConfig
from scratchbert.training.electra import GENERATOR_DIR, ElectraForPretraining
from scratchbert.training.evaluation import binned_auc, evaluate, logit_histogram
from scratchbert.training.pretrain import pretrain

TINY = {**TINY_PRETRAIN, "recipe": "packed", "objective": "electra"}  # conftest.py: its run, on the default recipe

# Accelerate keeps process-wide state; each in-process run here starts from none (conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """20 documents of the embedded CPython documentation, one paragraph each: a few batches of 8 packed examples,
    so an 8-step run with accumulation 2 crosses epoch boundaries."""
    return documentation_corpus(tmp_path_factory, documents=60)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, corpus_file) -> Path:
    return saved_tokenizer(tmp_path_factory, corpus_file, vocab_size=400)


@pytest.fixture(scope="module")
def tiny_config(corpus_file, tokenizer_dir):
    return run_config_maker(TINY, corpus_file, tokenizer_dir)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_config) -> Path:
    """One uninterrupted 8-step ELECTRA run with gradient accumulation 2 (the reference for resumption)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    output_dir = tmp_path_factory.mktemp("runs") / "electra"
    pretrain(tiny_config(output_dir, gradient_accumulation_steps=2))
    AcceleratorState._reset_state(reset_partial_state=True)
    return output_dir


def saved_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def tiny_model(seed: int = 0) -> ElectraForPretraining:
    torch.manual_seed(seed)
    config = ScratchBertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    return ElectraForPretraining(config, generator_layers=1, discriminator_weight=50.0)


def masked_batch(vocab_size: int = 60) -> dict[str, torch.Tensor]:
    """A collator-like batch of (3, 10): rows 1 and 2 padded; labels at 2-3 real positions per row,
    where input_ids hold [MASK] (id 4) or, at one position, a random token (the collator's 10%)."""
    gen = torch.Generator().manual_seed(1)
    original = torch.randint(5, vocab_size, (3, 10), generator=gen)
    attention_mask = torch.ones_like(original)
    attention_mask[1, 7:] = 0
    attention_mask[2, 4:] = 0
    labels = torch.full_like(original, IGNORE_INDEX)
    for row, positions in enumerate(([1, 4, 8], [0, 5], [2, 3])):
        labels[row, positions] = original[row, positions]
    input_ids = torch.where(labels != IGNORE_INDEX, 4, original)
    input_ids[0, 8] = (original[0, 8] + 1 - 5) % (vocab_size - 5) + 5  # a random replacement, not [MASK]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": torch.zeros_like(original), "labels": labels}


# --- the model ---------------------------------------------------------------------------------


def test_the_generator_reads_through_the_discriminators_embeddings():
    model = tiny_model()
    shared, own = model.discriminator.embeddings, model.generator.bert.embeddings
    assert own is shared
    for name, parameter in shared.named_parameters():  # word, position, token-type tables and LayerNorm
        assert model.generator.bert.embeddings.get_parameter(name).data_ptr() == parameter.data_ptr(), name
    decoder = model.generator.cls.predictions.decoder.weight
    assert decoder.data_ptr() == shared.word_embeddings.weight.data_ptr()  # the MLM decoder stays tied
    assert len(model.generator.bert.encoder.layer) == 1 and len(model.discriminator.encoder.layer) == 2

    # Still one tensor after an optimizer step: both losses move the same table.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = shared.word_embeddings.weight.detach().clone()
    model(**masked_batch()).loss.backward()
    optimizer.step()
    assert not torch.equal(before, shared.word_embeddings.weight)
    assert torch.equal(model.generator.get_input_embeddings().weight, shared.word_embeddings.weight)
    assert torch.equal(decoder, shared.word_embeddings.weight)


def test_the_discriminator_target_is_sampled_differs_from_original_over_real_tokens(monkeypatch):
    """The sample at the first labelled position of each row is the original token (target 0), the others
    a different token (target 1); the loss is the BCE over real tokens only, whatever padding holds."""
    model = tiny_model().eval()
    batch = masked_batch()
    labels, real = batch["labels"], batch["attention_mask"].bool()
    masked = labels != IGNORE_INDEX
    original = torch.where(masked, labels, batch["input_ids"])
    targets = labels[masked]  # (N,)
    first_of_row = torch.zeros_like(targets, dtype=torch.bool)
    first_of_row[[0, 3, 5]] = True  # rows hold 3, 2 and 2 labels
    planned = torch.where(first_of_row, targets, (targets - 5 + 1) % (60 - 5) + 5)
    monkeypatch.setattr(electra, "sample_tokens", lambda logits, generator=None: planned)

    out = model(**batch)
    assert torch.equal(out.corrupted_input_ids[~masked], original[~masked])  # the original text, not the [MASK]s
    assert torch.equal(out.corrupted_input_ids[masked], planned)
    assert torch.equal(out.replaced, out.corrupted_input_ids != original)
    assert torch.equal(out.replaced[masked], ~first_of_row)  # a sample equal to the original is not "replaced"
    assert not out.replaced[~masked].any()

    expected = F.binary_cross_entropy_with_logits(out.discriminator_logits[real], out.replaced[real].float())
    torch.testing.assert_close(out.discriminator_loss, expected)
    accuracy = ((out.discriminator_logits[real] > 0) == out.replaced[real]).float().mean()
    torch.testing.assert_close(out.discriminator_accuracy, accuracy)
    torch.testing.assert_close(out.generator_loss, F.cross_entropy(out.generator_logits, targets))
    torch.testing.assert_close(out.loss, out.generator_loss + 50.0 * out.discriminator_loss)
    padded_logits = out.discriminator_logits[~real]
    all_tokens = F.binary_cross_entropy_with_logits(out.discriminator_logits, out.replaced.float())
    assert padded_logits.numel() and not torch.isclose(all_tokens, expected)  # padding would have changed it

    # Whatever ids the padding holds, nothing changes.
    repadded = {**batch, "input_ids": batch["input_ids"].masked_fill(~real, 7)}
    torch.testing.assert_close(model(**repadded).discriminator_loss, out.discriminator_loss)


def test_samples_come_from_the_generator_given(monkeypatch):
    """The same torch.Generator seed gives the same samples, and then the global stream is left alone."""
    model = tiny_model().eval()
    batch = masked_batch()
    state = torch.get_rng_state()
    first = model(**batch, sampling_generator=torch.Generator().manual_seed(3)).corrupted_input_ids
    again = model(**batch, sampling_generator=torch.Generator().manual_seed(3)).corrupted_input_ids
    assert torch.equal(first, again) and torch.equal(torch.get_rng_state(), state)
    model(**batch)  # training draws from the global stream, which Accelerate checkpoints
    assert not torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_samples_follow_the_generators_softmax(dtype):
    """Inverse-CDF sampling draws from softmax(logits), as torch.multinomial did: each token's share of 200,000
    draws within 5 standard errors of its probability, and a token of probability 0 (logit -inf) never drawn."""
    logits = torch.tensor([[2.0, 0.0, -1.0, float("-inf"), 1.0, -3.0], [float("-inf"), 0.5, float("-inf"), 0.0, 3.0, -2.0]])
    logits = logits.to(dtype)
    draws = 100_000
    rows = logits.repeat_interleave(draws, dim=0)  # (2 * draws, V): each row drawn from `draws` times
    samples = electra.sample_tokens(rows, torch.Generator().manual_seed(0)).view(2, draws)  # (2, draws)
    expected = torch.softmax(logits.float(), dim=-1)  # (2, V)
    for row in range(2):
        counts = torch.bincount(samples[row], minlength=logits.shape[1]).double()
        shares = counts / draws
        standard_error = (expected[row].double() * (1 - expected[row].double()) / draws).sqrt()
        assert torch.all((shares - expected[row].double()).abs() <= 5 * standard_error + 1e-4), (row, shares, expected[row])
        assert counts[expected[row] == 0].sum() == 0
    assert samples.min() >= 0 and samples.max() < logits.shape[1]


def test_the_discriminator_learns_a_replacement_it_can_tell_apart(monkeypatch):
    """Replacements by a token the text never holds are found from the token alone: a working RTD
    path learns them in a few dozen steps, far above answering "original" everywhere. (From a generator
    still at the word-frequency plateau, replacements look like the text, and the discriminator stays at
    that base rate until the generator learns more: docs/pretraining.md.)"""
    model = tiny_model()
    never_in_text = 59  # masked_batch draws its text from 5..59; this one is kept out of it below
    monkeypatch.setattr(electra, "sample_tokens", lambda logits, generator=None: torch.full((logits.shape[0],), never_in_text))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        original = torch.randint(5, never_in_text, (8, 16), generator=gen)
        chosen = torch.rand(original.shape, generator=gen) < 0.3
        batch = {"input_ids": torch.where(chosen, 4, original), "labels": torch.where(chosen, original, IGNORE_INDEX)}
        out = model(**batch)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    everything_original = 1 - out.replaced.float().mean().item()
    assert out.discriminator_accuracy.item() > everything_original + 0.1, (out.discriminator_accuracy, everything_original)
    held_out = {"input_ids": batch["input_ids"], "attention_mask": torch.ones_like(original), "token_type_ids": torch.zeros_like(original),
                "labels": batch["labels"]}  # fmt: skip
    assert evaluate(model, [held_out], Accelerator(cpu=True))["rtd_auc"] > 0.9  # 0.35 before these 40 steps


@pytest.mark.parametrize("integer_logits", [True, False])
def test_rtd_auc_is_the_rank_statistic_of_replaced_over_original(integer_logits):
    """The evaluation's AUC from binned logits equals P(replaced logit > original logit) + half the ties, over
    real tokens only: exactly for logits on the bins' edges (ties in one bin), to 1e-3 for continuous ones."""
    gen = torch.Generator().manual_seed(0)
    replaced = torch.rand(16, 50, generator=gen) < 0.2  # (B, S)
    logits = torch.randn(16, 50, generator=gen) + 0.8 * replaced  # replaced tokens score higher on average
    if integer_logits:
        logits = logits.round()
    logits[0, 0], logits[0, 1] = 40.0, -40.0  # past the binned range: the outermost bins
    attention_mask = (torch.arange(50) < 40).long().expand(16, 50)  # the last 10 positions are padding
    real = attention_mask.bool()
    logits[~real] = torch.where(replaced[~real], -30.0, 30.0)  # padding that would turn the AUC upside down if counted
    positive, negative = logits[real & replaced], logits[real & ~replaced]
    wins = (positive[:, None] > negative[None, :]).double() + 0.5 * (positive[:, None] == negative[None, :]).double()
    exact = wins.mean().item()
    binned = binned_auc(logit_histogram(logits, replaced, attention_mask))
    assert binned == pytest.approx(exact, abs=1e-12 if integer_logits else 1e-3)
    assert binned_auc(logit_histogram(logits, torch.zeros_like(replaced), attention_mask)) is None  # nothing replaced: undefined


def test_evaluation_is_deterministic_and_reports_the_generator_and_the_discriminator(deterministic_mode):
    # No CPU kernel chosen by timing (cpu_gemm): in a fresh process the first evaluation's products would
    # be its kernels' trials, and the second one's rounding (~1e-9) could differ from it.
    torch.use_deterministic_algorithms(True)
    model = tiny_model()
    batches = [masked_batch(), masked_batch()]
    accelerator = Accelerator(cpu=True)
    state = torch.get_rng_state()
    first, second = evaluate(model, batches, accelerator), evaluate(model, batches, accelerator)
    assert first == second and torch.equal(torch.get_rng_state(), state)
    assert model.training  # evaluation puts the model back in training mode
    assert first["eval_masked_tokens"] == 2 * 7 and first["eval_examples"] == 6
    real_tokens = 2 * (10 + 7 + 4)
    assert 0 < first["replaced_fraction"] <= 7 / 21 and (first["replaced_fraction"] * real_tokens) == pytest.approx(
        round(first["replaced_fraction"] * real_tokens)
    )
    assert 0 <= first["rtd_accuracy"] <= 1 and (first["rtd_accuracy"] * real_tokens) == pytest.approx(round(first["rtd_accuracy"] * real_tokens))
    assert 0 <= first["rtd_auc"] <= 1
    assert {"mlm_loss", "mlm_accuracy", "perplexity"} <= set(first) and "nsp_accuracy" not in first


# --- a run ---------------------------------------------------------------------------------------


def test_a_short_run_learns_and_logs_the_objective(finished_run):
    records = run_log(finished_run)
    assert records[0]["type"] == "start" and records[0]["objective"] == "electra"
    losses = [r["loss"] for r in records if r["type"] == "train"]
    assert len(losses) == 8 and sum(losses[-2:]) < 0.98 * sum(losses[:2])  # 8 steps at a decaying rate: a few percent
    evals = [r for r in records if r["type"] == "eval"]
    assert [r["step"] for r in evals] == [4, 8]
    for record in evals:
        assert 0 < record["replaced_fraction"] < 1 and 0.5 < record["rtd_accuracy"] <= 1  # most tokens are original
        assert 0 <= record["rtd_auc"] <= 1
        assert 0 <= record["mlm_accuracy"] <= 1 and record["perplexity"] > 1
    saved = json.loads((finished_run / "pretrain_config.json").read_text())
    assert (saved["objective"], saved["generator_layers"], saved["discriminator_weight"]) == ("electra", 1, 50.0)


def test_the_output_holds_the_discriminator_and_the_generator(finished_run, capsys):
    import scratchbert  # noqa: F401  (registers the Auto classes)
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    discriminator = AutoModel.from_pretrained(finished_run)
    assert type(discriminator) is ScratchBertModel and len(discriminator.encoder.layer) == 2
    assert discriminator.config.architectures == ["ScratchBertModel"]
    assert discriminator.config.hidden_dropout_prob == discriminator.config.attention_probs_dropout_prob == 0.1  # fine-tuning's
    weights = saved_weights(finished_run)
    assert not any(key.startswith(("discriminator", "generator", "cls", "pooler")) for key in weights)  # a bare encoder
    assert "encoder.layer.1.output.dense.weight" in weights

    generator = AutoModelForMaskedLM.from_pretrained(finished_run / GENERATOR_DIR)
    assert type(generator) is ScratchBertForMaskedLM and len(generator.bert.encoder.layer) == 1
    generator_weights = saved_weights(finished_run / GENERATOR_DIR)
    for name in ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight", "LayerNorm.weight"):
        assert torch.equal(generator_weights[f"bert.embeddings.{name}"], weights[f"embeddings.{name}"]), name  # one table, saved twice
    assert AutoTokenizer.from_pretrained(finished_run / GENERATOR_DIR).get_vocab() == AutoTokenizer.from_pretrained(finished_run).get_vocab()

    assert main(["fill-mask", "the [MASK] statement leaves a loop.", "--model", str(finished_run / GENERATOR_DIR)]) == 0
    assert "[MASK] 1 of 1:" in capsys.readouterr().out
    # The discriminator has no MLM head: fill-mask says so, and where the generator is, rather than guess with random weights.
    assert main(["fill-mask", "the [MASK] statement.", "--model", str(finished_run)]) == 2
    assert f"its masked-language model is the generator: {finished_run / GENERATOR_DIR}" in capsys.readouterr().err


def test_the_demo_prints_the_generators_fill_mask(tiny_config, tmp_path, capsys, monkeypatch):
    from scratchbert.commands import pretrain as pretrain_command

    monkeypatch.setattr(pretrain_command, "pretrain", lambda config: pretrain(tiny_config(tmp_path / "run", max_steps=2, eval_every=0, save_every=0)))
    assert main(["pretrain", "--objective", "electra", "--fill-mask", "the [MASK] statement leaves a loop."]) == 0
    printed = capsys.readouterr().out
    assert "what the ELECTRA generator (the saved discriminator has no MLM head) fills in" in printed
    assert str(tmp_path / "run" / GENERATOR_DIR) in printed and "replaced-token detection accuracy" in printed


def test_overwrite_removes_the_generator_of_the_run_it_replaces(finished_run, tiny_config, tmp_path):
    import shutil

    output_dir = tmp_path / "reused"
    shutil.copytree(finished_run, output_dir)
    pretrain(tiny_config(output_dir, objective="mlm", overwrite=True, max_steps=2, eval_every=0, save_every=0))
    assert not (output_dir / GENERATOR_DIR).exists()  # fill-mask must not find the old run's generator
    assert "cls.predictions.transform.dense.weight" in saved_weights(output_dir)  # an MLM run's model


def test_export_bert_gives_transformers_the_same_encoder(finished_run, tmp_path):
    from transformers import BertModel

    assert main(["export-bert", str(finished_run), str(tmp_path / "bert")]) == 0
    ours = ScratchBertModel.from_pretrained(finished_run).eval()
    theirs = BertModel.from_pretrained(tmp_path / "bert").eval()
    ids = torch.tensor([[2, 10, 11, 12, 13, 3], [2, 20, 21, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        expected, exported = ours(ids, attention_mask=mask).last_hidden_state, theirs(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(exported[real], expected[real], atol=1e-5, rtol=1e-5)


def test_finetune_runs_on_the_discriminator(finished_run, corpus_file, tmp_path):
    words = corpus_file.read_text().split()
    rows = [{"text": " ".join(words[8 * n : 8 * n + 8]), "label": ("neg", "pos")[n % 2]} for n in range(32)]
    data = tmp_path / "train.csv"
    with open(data, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "classifier"
    code = main(
        ["finetune", str(finished_run), "--train-file", str(data), "--validation-file", str(data), "--output-dir", str(out),
         "--epochs", "1", "--batch-size", "8", "--max-length", "32"]
    )  # fmt: skip
    assert code == 0
    results = json.loads((out / "metrics.json").read_text())
    assert results["labels"] == ["neg", "pos"] and "accuracy" in results["validation"]
    from scratchbert import ScratchBertForSequenceClassification

    classifier = ScratchBertForSequenceClassification.from_pretrained(out)
    assert classifier.config.num_labels == 2


def test_stopped_and_resumed_run_ends_with_identical_weights(finished_run, tiny_config, tmp_path, monkeypatch):
    output_dir = tmp_path / "interrupted"
    config = tiny_config(output_dir, gradient_accumulation_steps=2)
    kill_after_saving(monkeypatch, 4, lambda: pretrain(config))
    assert ckpt.read_trainer_state(ckpt.list_checkpoints(output_dir)[-1][1])["step"] == 4
    AcceleratorState._reset_state(reset_partial_state=True)
    pretrain(tiny_config(output_dir, gradient_accumulation_steps=2, resume=True))

    for folder in (Path("."), Path(GENERATOR_DIR)):
        expected, resumed = saved_weights(finished_run / folder), saved_weights(output_dir / folder)
        assert expected.keys() == resumed.keys()
        for name in expected:
            assert torch.equal(expected[name], resumed[name]), (folder, name)
    run_record = lambda d: [(r["step"], r.get("loss"), r.get("rtd_accuracy")) for r in run_log(d) if r["type"] in ("train", "eval")]  # noqa: E731
    assert run_record(output_dir) == run_record(finished_run)


# --- configuration -------------------------------------------------------------------------------


def test_mlm_is_the_default_and_the_generator_depth_follows_the_model():
    assert PretrainConfig().objective == "mlm" and PretrainConfig().generator_layers is None
    assert PretrainConfig(objective="electra").generator_layers == 1  # tiny: 2 layers
    assert PretrainConfig(objective="electra", preset="base").generator_layers == 3
    assert PretrainConfig(objective="electra", preset="base", generator_layers=6).generator_layers == 6


def test_a_version_3_configuration_reads_as_mlm():
    saved = {**PretrainConfig().to_saved_dict(), "config_version": 3}
    for name in ("objective", "generator_layers", "discriminator_weight"):
        del saved[name]
    loaded = PretrainConfig.from_dict(saved)
    assert (loaded.objective, loaded.generator_layers, loaded.discriminator_weight) == ("mlm", None, 50.0)
    assert ckpt.config_differences(saved, PretrainConfig().to_dict()) == []  # an old run resumes
    assert "objective: checkpoint 'mlm', now 'electra'" in ckpt.config_differences(saved, PretrainConfig(objective="electra").to_dict())
    assert PretrainConfig().to_saved_dict()["config_version"] >= 4


@pytest.mark.parametrize(
    "options, message",
    [
        ({"recipe": "paper"}, "next-sentence prediction is not part of ELECTRA"),
        ({"nsp": True, "packing": "sentence-pairs"}, "--no-nsp"),
        ({"generator_layers": 0}, "generator_layers=0: the generator needs 1 to num_hidden_layers=2"),
        ({"generator_layers": 3}, "generator_layers=3"),
        ({"discriminator_weight": 0.0}, "discriminator_weight=0.0: it must be a positive number"),
        ({"discriminator_weight": -1.0}, "--discriminator-weight"),
        ({"objective": "gan"}, "objective='gan': choose one of mlm, electra"),
    ],
)
def test_electra_options_are_checked(options, message):
    with pytest.raises(ScratchBertError, match=message):
        PretrainConfig(**{"objective": "electra", **options})
    PretrainConfig(objective="electra", recipe="paper", nsp=False)  # sentence pairs without NSP are fine
