"""`scratchbert.training.precision`: the faster pretraining precision on this CPU, timed."""

import math

import torch

from scratchbert import ScratchBertConfig, cpu_gemm
from scratchbert.training.precision import faster_precision, training_rates

SMALL = dict(vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)


def test_a_trial_times_both_precisions_and_leaves_the_random_state_and_kernel_decisions_alone():
    torch.manual_seed(1234)
    random_state = torch.get_rng_state()
    decisions = [dict(table) for table in (cpu_gemm.DECISIONS, cpu_gemm.ATTENTION_DECISIONS)]
    rates = training_rates(ScratchBertConfig(**SMALL), batch_size=4, seq_length=16, steps=2, warmup=1, rounds=1)
    assert set(rates) == {"no", "bf16"} and all(math.isfinite(rate) and rate > 0 for rate in rates.values()), rates
    assert torch.equal(torch.get_rng_state(), random_state)  # the caller's seeded run draws what it would have
    assert [dict(table) for table in (cpu_gemm.DECISIONS, cpu_gemm.ATTENTION_DECISIONS)] == decisions
    assert not torch.is_autocast_enabled("cpu")
    # A model whose trial would outlast its bound is not timed (a run's start waits at most TRIAL_SECONDS).
    assert training_rates(ScratchBertConfig(**SMALL), batch_size=4, seq_length=16, max_seconds=0.0) is None
    assert torch.equal(torch.get_rng_state(), random_state)


def test_the_faster_precision_is_chosen_and_fp32_on_a_tie():
    assert faster_precision({"no": 39_500.0, "bf16": 31_000.0}) == "no"  # Intel Xeon, AMX hidden: tiny at 32 x 64
    assert faster_precision({"no": 30_000.0, "bf16": 45_000.0}) == "bf16"
    assert faster_precision({"no": 1.0, "bf16": 1.0}) == "no"
