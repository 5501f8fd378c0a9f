"""`scratchbert.training.pretraining.precision`: the faster pretraining precision on this CPU, timed."""

import math

import pytest
import torch

from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM, cpu_gemm
from scratchbert.training.pretraining import precision
from scratchbert.training.pretraining.config import PretrainConfig
from scratchbert.training.pretraining.precision import auto_precision, faster_precision, training_rates

SMALL = dict(vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)


def test_a_trial_times_both_precisions_and_leaves_the_random_state_and_kernel_decisions_alone():
    torch.manual_seed(1234)
    random_state = torch.get_rng_state()
    decisions = [dict(table) for table in (cpu_gemm.DECISIONS, cpu_gemm.ATTENTION_DECISIONS)]
    rates = training_rates(lambda: ScratchBertForMaskedLM(ScratchBertConfig(**SMALL)), batch_size=4, seq_length=16, steps=2, warmup=1, rounds=1)
    assert set(rates) == {"no", "bf16"} and all(math.isfinite(rate) and rate > 0 for rate in rates.values()), rates
    assert torch.equal(torch.get_rng_state(), random_state)  # the caller's seeded run draws what it would have
    assert [dict(table) for table in (cpu_gemm.DECISIONS, cpu_gemm.ATTENTION_DECISIONS)] == decisions
    assert not torch.is_autocast_enabled("cpu")
    # A model whose trial would outlast its bound is not timed (a run's start waits at most TRIAL_SECONDS).
    assert training_rates(lambda: ScratchBertForMaskedLM(ScratchBertConfig(**SMALL)), batch_size=4, seq_length=16, max_seconds=0.0) is None
    assert torch.equal(torch.get_rng_state(), random_state)


@pytest.mark.parametrize("options, model_class", [
    ({}, "ScratchBertForMaskedLM"), ({"recipe": "paper"}, "ScratchBertForPreTraining"),
])
def test_a_trial_trains_the_runs_own_model_mlm_or_nsp(options, model_class, monkeypatch):
    """The trial times what the run will train: an NSP step also trains the pooler and NSP head on
    sentence-pair labels; each at the run's masking rate."""
    geometry = {name: value for name, value in SMALL.items() if name != "vocab_size"}
    config = PretrainConfig(**options, **geometry, max_seq_length=32)
    built, fed = [], []

    def make_model():
        model = config.new_model(SMALL["vocab_size"])
        model.register_forward_pre_hook(lambda module, args, batch: fed.append(dict(batch)), with_kwargs=True)
        built.append(type(model).__name__)
        return model

    rates = training_rates(make_model, batch_size=8, seq_length=32, masking_rate=config.mlm_probability, steps=1, warmup=1, rounds=1)
    assert built == [model_class] and all(math.isfinite(rate) and rate > 0 for rate in rates.values()), rates
    batch = fed[0]
    assert ("next_sentence_label" in batch) is (options == {"recipe": "paper"})
    assert batch["labels"].shape == batch["input_ids"].shape == (8, 32)
    predicted = (batch["labels"] != -100).float().mean().item()
    assert abs(predicted - config.mlm_probability) < 0.1, predicted  # the run's rate: 30% packed, 15% paper


def test_the_faster_precision_is_chosen_and_fp32_near_a_tie():
    assert faster_precision({"no": 39_500.0, "bf16": 31_000.0}) == "no"  # Intel Xeon, AMX hidden: tiny at 32 x 64
    assert faster_precision({"no": 30_000.0, "bf16": 45_000.0}) == "bf16"
    assert faster_precision({"no": 1.0, "bf16": 1.0}) == "no"
    assert faster_precision({"no": 8_900.0, "bf16": 9_300.0}) == "no"  # within the timing's noise: fp32
    assert faster_precision({"no": 32_060.0, "bf16": 59_578.0}) == "bf16"  # AMD EPYC Zen 4, tiny at 32 x 64


def test_auto_takes_the_trials_answer_on_a_cpu_fp32_for_a_model_too_large_to_time_and_bf16_on_a_gpu_that_has_it(monkeypatch):
    make_model = lambda: ScratchBertForMaskedLM(ScratchBertConfig(**SMALL))  # noqa: E731
    monkeypatch.setattr(precision, "training_rates", lambda make_model, batch, length, masking_rate, max_seconds: {"no": 39_500.0, "bf16": 31_000.0})
    choice, reason = auto_precision(make_model, 32, 64, 0.3, on_gpu=False)
    assert choice == "no" and reason == "fp32 39,500, bf16 31,000 tokens/s in a timed trial of this model and batch: training in fp32"
    monkeypatch.setattr(precision, "training_rates", lambda make_model, batch, length, masking_rate, max_seconds: None)  # a step too slow to time
    choice, reason = auto_precision(make_model, 32, 64, 0.3, on_gpu=False)
    assert choice == "no" and "too slow to time both precisions in 10 s" in reason and "--mixed-precision bf16" in reason

    def no_trial_on_a_gpu(*args, **kwargs):
        raise AssertionError("a GPU's precision is not timed")

    monkeypatch.setattr(precision, "training_rates", no_trial_on_a_gpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for supported, expected in ((True, "bf16"), (False, "no")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: supported)
        assert auto_precision(make_model, 32, 64, 0.3, on_gpu=True)[0] == expected
