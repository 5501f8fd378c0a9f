"""cpu_gemm: every kernel gives the plain `F.linear`'s results, and the choice among them is sound.

Which kernel the measurement picks depends on the machine, so the tests force each one in turn
(by handing `choose` a measurement that favours it) and check the outputs and gradients against
the plain path: fp32 to 1e-5 relative, bf16 to bf16 rounding. The CPU-capability choices
(`cpu_gemm.AMX_BF16`, `cpu_gemm.BF16_UNITS`) are set for each kind of CPU in turn, so every path is
checked on any machine. No test asserts a timing.
"""

from __future__ import annotations

import copy
import gc
import json
import logging
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import fake_clock, forget_kernel_choices, small_batch
from torch import nn

import scratchbert.modeling_scratchbert as modeling
from scratchbert import ScratchBertConfig, ScratchBertModel, cpu_gemm
from scratchbert.bert_padding import CALL_COST, REDUCED_PRECISION_CALL_COST, default_call_cost
from scratchbert.cpu_kernels import attention_call_cost, bmm_attention, use_cpu_kernels

CPU = torch.device("cpu")
FP32_REL = 1e-5
BF16_REL = 2e-2  # a bf16 product summed in another order, and rounded once more: well inside this

needs_onednn = pytest.mark.skipif(not cpu_gemm.ONEDNN, reason="this torch cannot call oneDNN")


@pytest.fixture(autouse=True)
def fresh_decisions(monkeypatch):
    """Each test starts with no remembered decision, no disk cache, auto mode, every product rerouted,
    and proposals decided at once (the trial on real calls has tests of its own)."""
    forget_kernel_choices(monkeypatch)
    monkeypatch.setattr(cpu_gemm, "CONFIRM_CALLS", 0)
    monkeypatch.setattr(cpu_gemm, "_disk", {})
    monkeypatch.delenv("SCRATCHBERT_GEMM", raising=False)
    monkeypatch.delenv("SCRATCHBERT_GEMM_CACHE", raising=False)
    monkeypatch.setattr(cpu_gemm, "MIN_FLOPS", 0)
    yield
    cpu_gemm.PACKED.entries.clear()


def favour(monkeypatch, kernel: str, fp32_kernel: str = "mkl") -> list[cpu_gemm.Gemm]:
    """Make the measurement find `kernel` fastest wherever it can run (else "mkl"), and fp32 products
    of the "fp32" kernel `fp32_kernel`. Returns the list of products measured."""
    measured = []

    def measure(gemm):
        measured.append(gemm)
        wanted = fp32_kernel if gemm.dtype == torch.float32 and kernel == "fp32" else kernel
        return {k: (0.5 if k == wanted else 1.0) for k in cpu_gemm.candidates(gemm)}

    monkeypatch.setattr(cpu_gemm, "measure", measure)
    return measured


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# ---- the choice ---------------------------------------------------------------------------
def gemm(product="forward", dtype=torch.float32, inference=True, rows=256, k=48, n=40):
    return cpu_gemm.Gemm(product, rows, k, n, dtype, inference)


def test_candidates_by_product_dtype_and_mode():
    dnn = ["onednn"] if cpu_gemm.ONEDNN else []
    assert cpu_gemm.candidates(gemm()) == ["mkl", *dnn, *(["onednn-packed"] if dnn else [])]
    assert cpu_gemm.candidates(gemm(inference=False)) == ["mkl", *dnn]  # training: the weight changes every step
    assert cpu_gemm.candidates(gemm("grad_weight", inference=False)) == ["mkl", *dnn]
    bf16_dnn = dnn if cpu_gemm.runnable("onednn", torch.bfloat16) else []  # not on AVX2-only CPUs
    assert cpu_gemm.candidates(gemm("grad_input", torch.bfloat16, False)) == ["mkl", *bf16_dnn, "fp32"]


def test_a_machine_without_onednn_falls_back_cleanly(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "ONEDNN", False)
    assert cpu_gemm.candidates(gemm()) == ["mkl"]
    assert cpu_gemm.candidates(gemm(dtype=torch.bfloat16)) == ["mkl", "fp32"]
    assert cpu_gemm.choose(gemm()) == "mkl"  # one candidate: nothing to measure
    monkeypatch.setenv("SCRATCHBERT_GEMM", "onednn")
    cpu_gemm._warn_once.cache_clear()
    with pytest.warns(UserWarning, match="cannot call oneDNN") as warned:
        assert cpu_gemm.choose(gemm()) == "mkl"
        assert cpu_gemm.choose(gemm(rows=512)) == "mkl"
    assert len(warned) == 1  # once, not once per shape
    monkeypatch.delenv("SCRATCHBERT_GEMM")
    layer, x = nn.Linear(48, 40), torch.randn(300, 48)
    torch.testing.assert_close(cpu_gemm.linear(x, layer), F.linear(x, layer.weight, layer.bias))


@needs_onednn
@pytest.mark.parametrize("override, inference, expected", [
    ("mkl", True, "mkl"), ("mkl", False, "mkl"),
    ("onednn", True, "onednn-packed"), ("onednn", False, "onednn"),
])
def test_the_override_decides_without_measuring(monkeypatch, override, inference, expected):
    measured = favour(monkeypatch, "onednn")
    monkeypatch.setenv("SCRATCHBERT_GEMM", override)
    for _ in range(2):
        assert cpu_gemm.choose(gemm(inference=inference)) == expected
    assert measured == [] and cpu_gemm.DECISIONS == {}


@needs_onednn
def test_deterministic_mode_chooses_nothing_by_timing(monkeypatch, deterministic_mode):
    """In torch's deterministic mode a choice by timing could differ between two runs: every product
    takes torch's own call and attention its training candidate, unmeasured and untried, until the
    mode is off again. A forced `SCRATCHBERT_GEMM=onednn` still wins (it times nothing either)."""
    measured = favour(monkeypatch, "onednn")
    monkeypatch.setattr(cpu_gemm, "CONFIRM_CALLS", 3)
    monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", 128)
    monkeypatch.setattr(cpu_gemm, "AMX_BF16", False)
    torch.use_deterministic_algorithms(True)
    for inference in (True, False):
        assert cpu_gemm.choose(gemm(inference=inference)) == "mkl"
    with torch.no_grad():  # in inference the two attention kernels would otherwise take turns on trial
        assert [cpu_gemm.attention_kernel(torch.randn(2, 4, 10, 8)) for _ in range(3)] == ["bmm"] * 3
    assert measured == [] and cpu_gemm.DECISIONS == {} and cpu_gemm.TRIALS == cpu_gemm.ATTENTION_TRIALS == {}
    layer, x = nn.Linear(48, 40), torch.randn(300, 48)
    assert torch.equal(cpu_gemm.linear(x, layer), F.linear(x, layer.weight, layer.bias))  # the plain call itself
    monkeypatch.setenv("SCRATCHBERT_GEMM", "onednn")
    assert cpu_gemm.choose(gemm(inference=False)) == "onednn"
    monkeypatch.delenv("SCRATCHBERT_GEMM")
    torch.use_deterministic_algorithms(False)
    assert cpu_gemm.choose(gemm(inference=False)) == "onednn" and measured  # measured again outside the mode


def test_a_bad_override_says_what_to_write(monkeypatch):
    monkeypatch.setenv("SCRATCHBERT_GEMM", "fastest")
    with pytest.raises(ValueError, match="one of auto, mkl, onednn"):
        cpu_gemm.choose(gemm())


@needs_onednn
def test_auto_measures_each_bucket_once_and_needs_a_clear_win(monkeypatch):
    measured = favour(monkeypatch, "onednn")
    assert cpu_gemm.choose(gemm()) == "onednn"
    assert cpu_gemm.choose(gemm()) == "onednn" and len(measured) == 1  # remembered
    assert cpu_gemm.choose(gemm(inference=False)) == "onednn" and len(measured) == 2  # another mode, another key
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert cpu_gemm.choose(gemm()) == "onednn" and len(measured) == 3  # another thread count too
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(cpu_gemm, "measure", lambda g: {"mkl": 1.0, "onednn": 0.97})  # 3%: below MARGIN
    assert cpu_gemm.choose(gemm(rows=512)) == "mkl"


@needs_onednn
def test_a_kernel_that_fails_or_disagrees_is_never_chosen(monkeypatch):
    original = cpu_gemm._multiply

    def broken(kernel, a, b, bias, weight=None, bf16_values=False):
        if kernel == "onednn":
            raise RuntimeError("no primitive for this shape")
        out = original(kernel, a, b, bias, weight, bf16_values)
        return out + 1.0 if kernel == "onednn-packed" else out  # a wrong answer

    monkeypatch.setattr(cpu_gemm, "_multiply", broken)
    times = cpu_gemm.measure(gemm(rows=64))
    assert set(times) == {"mkl"}
    assert cpu_gemm.choose(gemm(rows=64)) == "mkl"


@needs_onednn
def test_a_chosen_kernel_that_fails_on_a_real_call_falls_back_for_good(monkeypatch):
    favour(monkeypatch, "onednn")
    layer, x = nn.Linear(48, 40), torch.randn(300, 48, requires_grad=True)
    original = cpu_gemm._multiply
    calls = []

    def fails_after_measuring(kernel, *args, **kwargs):
        calls.append(kernel)
        if kernel == "onednn":
            raise RuntimeError("unsupported strides")
        return original(kernel, *args, **kwargs)

    monkeypatch.setattr(cpu_gemm, "_multiply", fails_after_measuring)
    with pytest.warns(UserWarning, match="onednn failed"):
        out = cpu_gemm.linear(x, layer)
        out.sum().backward()
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
    assert set(cpu_gemm.DECISIONS.values()) == {"mkl"}  # forward, grad_input and grad_weight alike
    calls.clear()
    cpu_gemm.linear(x, layer)
    assert calls == ["mkl"]


def test_measure_times_every_working_candidate(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "MEASURE_ROUNDS", 2)
    for g in (gemm(), gemm("grad_input", inference=False), gemm("grad_weight", torch.bfloat16, False)):
        times = cpu_gemm.measure(g)
        assert set(times) == set(cpu_gemm.candidates(g))
        assert all(0 < t < float("inf") for t in times.values())
    with torch.inference_mode():  # where inference usually runs: the packed weight is measured too
        assert set(cpu_gemm.measure(gemm(dtype=torch.bfloat16))) == set(cpu_gemm.candidates(gemm(dtype=torch.bfloat16)))


def test_training_is_measured_at_its_own_rows_and_inference_cut_to_fewer(monkeypatch):
    """Inference times a cut product (real calls then confirm the pick); training, which has no such
    trial, times the rows it will run up to `TRAINING_MEASURE_FLOPS` (a cut product picked a kernel
    slower at the real rows: docs/performance.md)."""
    monkeypatch.setattr(cpu_gemm, "MEASURE_ROUNDS", 1)
    monkeypatch.setattr(cpu_gemm, "MEASURE_FLOPS", 2 * 128 * 96 * 80)  # 128 rows of a 96 -> 80 product
    monkeypatch.setattr(cpu_gemm, "TRAINING_MEASURE_FLOPS", 2 * 1024 * 96 * 80)
    timed_rows = []
    original = cpu_gemm._operands
    monkeypatch.setattr(cpu_gemm, "_operands", lambda g, rows, n: timed_rows.append((g.product, rows, n)) or original(g, rows, n))
    for product, inference in (("forward", True), ("forward", False), ("grad_input", False), ("grad_weight", False)):
        cpu_gemm.measure(cpu_gemm.Gemm(product, 512, 96, 80, torch.float32, inference))
    cpu_gemm.measure(cpu_gemm.Gemm("forward", 4096, 96, 80, torch.float32, False))  # above the training cap: cut
    assert timed_rows == [("forward", 128, 80), ("forward", 512, 80), ("grad_input", 512, 80), ("grad_weight", 512, 80), ("forward", 1024, 80)]


@needs_onednn
def test_decisions_persist_on_disk_and_only_available_kernels_are_read(monkeypatch, tmp_path):
    path = tmp_path / "gemm.json"
    monkeypatch.setenv("SCRATCHBERT_GEMM_CACHE", str(path))
    favour(monkeypatch, "onednn")
    assert cpu_gemm.choose(gemm()) == "onednn"
    saved = json.loads(path.read_text())
    assert saved == {gemm().key(): "onednn"}
    assert "threads" in gemm().key() and "inference" in gemm().key()

    # A new process (no decisions in memory) reads the file instead of measuring.
    monkeypatch.setattr(cpu_gemm, "DECISIONS", {})
    monkeypatch.setattr(cpu_gemm, "_disk", {})
    monkeypatch.setattr(cpu_gemm, "measure", lambda g: pytest.fail("measured despite the cache"))
    assert cpu_gemm.choose(gemm()) == "onednn"

    # An entry naming a kernel this machine cannot run is measured again.
    path.write_text(json.dumps({gemm().key(): "onednn-packed", gemm(rows=512).key(): "fp32"}))
    monkeypatch.setattr(cpu_gemm, "DECISIONS", {})
    monkeypatch.setattr(cpu_gemm, "_disk", {})
    measured = favour(monkeypatch, "mkl")
    assert cpu_gemm.choose(gemm()) == "onednn-packed"
    assert cpu_gemm.choose(gemm(rows=512)) == "mkl" and len(measured) == 1


# ---- the proposal on trial: real calls decide ---------------------------------------------------
def slow_down(monkeypatch, kernel: str, seconds: float = 0.02) -> list[str]:
    """Make every real call of `kernel` take `seconds` longer than the other's on cpu_gemm's clock
    (a `FakeClock`: the load of the machine cannot reorder them); returns the kernels of the calls made."""
    calls, original = [], cpu_gemm._run
    clock = fake_clock(monkeypatch, cpu_gemm)

    def run(gemm, k, *args, **kwargs):
        calls.append(k)
        clock.advance(seconds if k == kernel else 0.001)
        return original(gemm, k, *args, **kwargs)

    monkeypatch.setattr(cpu_gemm, "_run", run)
    return calls


@needs_onednn
@pytest.mark.parametrize("slower, decided", [("onednn", "mkl"), ("mkl", "onednn")])
def test_a_proposal_is_kept_only_if_real_calls_confirm_it(monkeypatch, slower, decided):
    """The microbenchmark proposes oneDNN; the next real calls alternate with torch's own, and the faster stays."""
    monkeypatch.setattr(cpu_gemm, "CONFIRM_CALLS", 3)
    favour(monkeypatch, "onednn")
    calls = slow_down(monkeypatch, slower)
    layer = nn.Linear(48, 40)
    with torch.no_grad():
        for i in range(8):
            x = torch.randn(200 + i, 48)  # rows vary within the bucket: times are compared per row
            torch.testing.assert_close(cpu_gemm.linear(x, layer), F.linear(x, layer.weight, layer.bias),
                                       rtol=FP32_REL, atol=1e-5)
            if i < 5:  # on trial: no decision yet, and no fused post-op
                assert cpu_gemm.settled(gemm(rows=256, n=40, k=48)) is None
                assert cpu_gemm.linear_post_op(x, layer, "gelu") is None
    assert calls[:6] == ["onednn", "mkl"] * 3  # they take turns
    assert calls[6:] == [decided] * 2
    assert cpu_gemm.TRIALS == {} and set(cpu_gemm.DECISIONS.values()) == {decided}


@needs_onednn
def test_a_confirmed_decision_is_what_the_disk_cache_keeps(monkeypatch, tmp_path):
    path = tmp_path / "gemm.json"
    monkeypatch.setenv("SCRATCHBERT_GEMM_CACHE", str(path))
    monkeypatch.setattr(cpu_gemm, "CONFIRM_CALLS", 2)
    favour(monkeypatch, "onednn")
    slow_down(monkeypatch, "onednn")
    layer, x = nn.Linear(48, 40), torch.randn(256, 48)
    with torch.no_grad():
        cpu_gemm.linear(x, layer)
        assert not path.exists()  # a proposal is not saved
        for _ in range(3):
            cpu_gemm.linear(x, layer)
    assert json.loads(path.read_text()) == {gemm(rows=256, n=40, k=48).key(): "mkl"}


@needs_onednn
def test_training_decides_without_a_trial(monkeypatch):
    """Alternating kernels in training would make the weights depend on when a trial ended: none there."""
    monkeypatch.setattr(cpu_gemm, "CONFIRM_CALLS", 3)
    favour(monkeypatch, "onednn")
    layer, x = nn.Linear(48, 40), torch.randn(256, 48, requires_grad=True)
    cpu_gemm.linear(x, layer).sum().backward()
    assert cpu_gemm.TRIALS == {} and set(cpu_gemm.DECISIONS.values()) == {"onednn"}


def test_a_trial_keeps_the_outputs_and_gradients_of_the_plain_call(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "CONFIRM_CALLS", 2)
    favour(monkeypatch, "onednn" if cpu_gemm.ONEDNN else "fp32")
    torch.manual_seed(0)
    layer = nn.Linear(48, 40)
    for _ in range(4):
        x = torch.randn(100, 48, requires_grad=True)
        out = cpu_gemm.linear(x, layer)
        out.square().sum().backward()
        grad_ours, weight_grad = x.grad.clone(), layer.weight.grad.clone()
        layer.zero_grad()
        x.grad = None
        F.linear(x, layer.weight, layer.bias).square().sum().backward()
        assert relative(grad_ours, x.grad) <= FP32_REL and relative(weight_grad, layer.weight.grad) <= FP32_REL
        layer.zero_grad()


@pytest.mark.parametrize("rows, size", [(1, 1), (2, 2), (3, 4), (430, 512), (512, 512), (2048, 2048)])
def test_rows_bucket_to_powers_of_two(rows, size):
    assert cpu_gemm.bucket(rows) == size


# ---- every kernel equals the plain path --------------------------------------------------
# (kernel, dtype, autocast): bf16 with bf16 weights and under autocast on fp32 weights.
KERNEL_CASES = [
    *((kernel, torch.float32, False) for kernel in ("mkl", "onednn", "onednn-packed")),
    *((kernel, torch.bfloat16, autocast) for kernel in ("mkl", "onednn", "onednn-packed", "fp32") for autocast in (False, True)),
]


def check_kernel_available(kernel, dtype=torch.float32):
    """Skip, with the reason, a kernel this torch or this CPU cannot run (e.g. oneDNN bf16 on AVX2 only)."""
    if kernel.startswith("onednn") and not cpu_gemm.ONEDNN:
        pytest.skip("this torch cannot call oneDNN")
    if not cpu_gemm.runnable(kernel, dtype):
        pytest.skip(f"{kernel} cannot multiply in {dtype} on this CPU (cpu_gemm.runnable's trial call failed)")


@pytest.mark.parametrize("kernel, dtype, autocast", KERNEL_CASES)
def test_every_kernel_equals_f_linear_forward(monkeypatch, kernel, dtype, autocast):
    check_kernel_available(kernel, dtype)
    favour(monkeypatch, kernel, fp32_kernel="onednn" if cpu_gemm.ONEDNN else "mkl")
    torch.manual_seed(0)
    layer = nn.Linear(96, 80).to(torch.float32 if autocast else dtype)
    x = torch.randn(3, 50, 96, dtype=layer.weight.dtype)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = cpu_gemm.linear(x, layer)
        plain = layer(x)
    assert out.shape == (3, 50, 80) and out.dtype == plain.dtype
    assert relative(out, plain) <= (FP32_REL if dtype == torch.float32 else BF16_REL)
    assert kernel in set(cpu_gemm.DECISIONS.values())


@pytest.mark.parametrize("kernel, dtype, autocast", [case for case in KERNEL_CASES if case[0] != "onednn-packed"])
def test_every_kernel_equals_f_linear_backward(monkeypatch, kernel, dtype, autocast):
    """Forward, grad_input = g·W, grad_weight = gᵀ·x and the bias gradient, all three products forced."""
    check_kernel_available(kernel, dtype)
    favour(monkeypatch, kernel, fp32_kernel="onednn" if cpu_gemm.ONEDNN else "mkl")
    torch.manual_seed(0)
    weights_dtype = torch.float32 if autocast else dtype
    results = []
    for run in (cpu_gemm.linear, lambda x, layer: layer(x)):
        torch.manual_seed(0)
        layer = nn.Linear(96, 80).to(weights_dtype)
        x = torch.randn(3, 50, 96, dtype=weights_dtype, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = run(x, layer)
        (out.float().square().sum() / 100).backward()
        results.append((out.detach(), x.grad, layer.weight.grad, layer.bias.grad))
    rel = FP32_REL if dtype == torch.float32 else BF16_REL
    for ours, plain in zip(*results):
        assert ours.dtype == plain.dtype  # fp32 master gradients under autocast, as autocast gives
        assert relative(ours, plain) <= rel
    products = {g.product for g, _ in cpu_gemm.DECISIONS if g.dtype == dtype}
    assert products == set(cpu_gemm.PRODUCTS)
    assert {k for (g, _), k in cpu_gemm.DECISIONS.items() if g.dtype == dtype} == {kernel}


@needs_onednn
@pytest.mark.parametrize("update", ["fused AdamW", "foreach AdamW", "loop AdamW", "SGD", ".data edit"])
def test_the_packed_weight_follows_every_kind_of_update(monkeypatch, update):
    """An evaluation between training steps multiplies by the current weights, however they were written.

    torch's fused AdamW (Trainer's default) writes without bumping `_version`, and `.data` has a
    version counter of its own: with the version alone as the stamp, the second evaluation used
    the first one's weights."""
    favour(monkeypatch, "onednn-packed")
    layer = nn.Linear(64, 32)
    x = torch.randn(100, 64)
    optimizers = {
        "fused AdamW": lambda: torch.optim.AdamW(layer.parameters(), lr=0.1, fused=True),
        "foreach AdamW": lambda: torch.optim.AdamW(layer.parameters(), lr=0.1, foreach=True),
        "loop AdamW": lambda: torch.optim.AdamW(layer.parameters(), lr=0.1, foreach=False),
        "SGD": lambda: torch.optim.SGD(layer.parameters(), lr=0.1),
    }
    optimizer = optimizers[update]() if update in optimizers else None
    for _ in range(3):
        with torch.no_grad():  # an evaluation: the packed copy is made, or reused
            out = cpu_gemm.linear(x, layer)
            torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=FP32_REL, atol=1e-5)
        assert len(cpu_gemm.PACKED.entries) == 1
        if optimizer is None:
            layer.weight.data.mul_(0.5)
        else:
            layer(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():
        torch.testing.assert_close(cpu_gemm.linear(x, layer), F.linear(x, layer.weight, layer.bias), rtol=FP32_REL, atol=1e-5)


def test_the_packed_weight_follows_weight_updates(monkeypatch):
    favour(monkeypatch, "onednn-packed")
    layer = nn.Linear(64, 32)
    x = torch.randn(100, 64)
    with torch.no_grad():
        first = cpu_gemm.linear(x, layer)
        assert len(cpu_gemm.PACKED.entries) == 1
        layer.weight.mul_(2.0)  # in place, as an optimizer step or load_state_dict
        second = cpu_gemm.linear(x, layer)
        torch.testing.assert_close(second, F.linear(x, layer.weight, layer.bias), rtol=FP32_REL, atol=1e-5)
        assert relative(second - layer.bias, first - layer.bias) > 0.5
        layer.weight = nn.Parameter(torch.randn(32, 64))  # a new tensor
        torch.testing.assert_close(cpu_gemm.linear(x, layer), F.linear(x, layer.weight, layer.bias),
                                   rtol=FP32_REL, atol=1e-5)
    del layer
    gc.collect()
    assert cpu_gemm.PACKED.entries == {}  # the copies die with their weights


def spy_linear(monkeypatch) -> list:
    calls = []
    original = F.linear

    def spy(x, weight, bias=None):
        calls.append(x.shape)
        return original(x, weight, bias)

    monkeypatch.setattr(F, "linear", spy)
    return calls


@pytest.mark.parametrize("case", ["small", "tracing", "fp16", "mkl override", "mixed dtypes"])
def test_what_is_not_rerouted_is_one_plain_f_linear(monkeypatch, case):
    measured = favour(monkeypatch, "onednn")
    layer, x = nn.Linear(48, 40), torch.randn(64, 48)
    if case == "small":
        monkeypatch.setattr(cpu_gemm, "MIN_FLOPS", 2 * 64 * 48 * 40 + 1)
    elif case == "tracing":
        monkeypatch.setattr(cpu_gemm, "is_tracing", lambda: True)
    elif case == "fp16":
        layer, x = layer.half(), x.half()
    elif case == "mkl override":
        monkeypatch.setenv("SCRATCHBERT_GEMM", "mkl")
    else:
        layer = layer.double()  # x fp32, weight fp64: the plain call raises its own error
    calls = spy_linear(monkeypatch)
    if case == "mixed dtypes":
        with pytest.raises(RuntimeError):
            cpu_gemm.linear(x, layer)
    else:
        cpu_gemm.linear(x, layer)
    assert calls == [x.shape] and measured == []


def test_a_traced_model_records_plain_linears(monkeypatch):
    measured = favour(monkeypatch, "onednn")
    torch.manual_seed(0)
    model = use_cpu_kernels(nn.Sequential(nn.Linear(48, 40)))
    with torch.no_grad():
        traced = torch.jit.trace(model, torch.randn(64, 48), check_trace=False)  # (the check reruns it untraced)
    graph = str(traced.inlined_graph)
    assert "aten::linear" in graph and "mkldnn" not in graph and measured == []
    x = torch.randn(30, 48)
    torch.testing.assert_close(traced(x), F.linear(x, model[0].weight, model[0].bias))


def test_use_cpu_kernels_swaps_linears_in_place_and_back(monkeypatch):
    favour(monkeypatch, "onednn" if cpu_gemm.ONEDNN else "mkl")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 64), nn.GELU(), nn.Linear(64, 40))
    x = torch.randn(100, 48)
    plain = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert use_cpu_kernels(model) is model
    assert all(type(m) is cpu_gemm.MeasuredLinear for m in (model[0], model[2]))
    assert relative(model(x), plain) <= FP32_REL and cpu_gemm.DECISIONS
    assert model.state_dict().keys() == state.keys()
    use_cpu_kernels(model, enabled=False)
    assert all(type(m) is nn.Linear for m in (model[0], model[2]))


# ---- the model on every kernel -----------------------------------------------------------
def tiny_model(**overrides):
    torch.manual_seed(0)
    fields = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ScratchBertModel(ScratchBertConfig(**{**fields, **overrides}))


@pytest.mark.parametrize("padded", [True, False], ids=["padding-free path", "full batch"])
@pytest.mark.parametrize("kernel", ["onednn", "mkl"])
def test_model_outputs_and_gradients_equal_the_plain_path(monkeypatch, padded, kernel):
    check_kernel_available(kernel)
    model = tiny_model()
    ids, mask = small_batch(padded)
    # A loss along a fixed random direction: the sum of squares of a LayerNorm's output is a constant
    # (H per token), which left every gradient below the last LayerNorm at rounding noise, near 0.
    direction = torch.randn(*ids.shape, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    results = []
    for mode in ("mkl", "auto"):
        monkeypatch.setenv("SCRATCHBERT_GEMM", mode)
        favour(monkeypatch, kernel)
        model.zero_grad()
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state * mask[..., None]
        (hidden * direction).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append((hidden.detach(), *grads))
    assert kernel in set(cpu_gemm.DECISIONS.values())
    # Another kernel sums in another order, so an element is off by roundings of the terms summed into it,
    # whatever its own size: the absolute tolerance is 1e-5 of the tensor's largest element. Some gradients
    # are 0 but for rounding (a key bias: softmax ignores a shift of every score); their yardstick is a
    # thousandth of the largest output or gradient.
    floor = 1e-3 * max(plain.abs().max().item() for plain in results[0])
    for ours, plain in zip(results[1], results[0]):
        torch.testing.assert_close(ours, plain, atol=FP32_REL * max(plain.abs().max().item(), floor), rtol=FP32_REL)


# ---- bf16 on the fp32 kernel: what CPUs without bf16 units get -------------------------------
def test_bf16_on_the_fp32_kernel_is_a_bf16_gemm_on_bf16_values(monkeypatch):
    favour(monkeypatch, "fp32")
    torch.manual_seed(0)
    layer = nn.Linear(768, 3072)
    x = torch.randn(3, 40, 768)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        native = layer(x)
        emulated = cpu_gemm.linear(x, layer)
    # Exactly what the fp32 kernel gives on the bf16-rounded inputs.
    exact = F.linear(x.bfloat16().float(), layer.weight.bfloat16().float(), layer.bias.bfloat16().float())
    assert emulated.dtype == torch.bfloat16 and emulated.shape == (3, 40, 3072)
    torch.testing.assert_close(emulated, exact.bfloat16(), rtol=0, atol=0)
    # A bf16 GEMM sums in another order (and its output rounding): within bf16's resolution (2^-8 relative).
    torch.testing.assert_close(emulated.float(), native.float(), rtol=2**-7, atol=2e-2)
    with torch.no_grad():
        torch.testing.assert_close(cpu_gemm.linear(x.bfloat16(), layer.to(torch.bfloat16)), emulated, rtol=0, atol=0)


@pytest.mark.parametrize("padded", [True, False], ids=["padding-free path", "full batch"])
def test_bf16_model_is_the_same_on_the_fp32_kernel(monkeypatch, padded):
    """bf16 weights and bf16 autocast: the fp32-kernel choice agrees with bf16 GEMMs to bf16 rounding."""
    torch.manual_seed(0)
    config = ScratchBertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
    model = ScratchBertModel(config).eval()
    ids = torch.randint(5, 99, (3, 20))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 12:] = 0
    keep = mask.bool()
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).last_hidden_state[keep]
        for variant, autocast in ((model, True), (copy.deepcopy(model).to(torch.bfloat16), False)):
            outs = []
            for kernel in ("mkl", "fp32"):
                favour(monkeypatch, kernel)
                monkeypatch.setattr(cpu_gemm, "DECISIONS", {})
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    outs.append(variant(input_ids=ids, attention_mask=mask).last_hidden_state[keep].float())
            torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0.06)
            for out in outs:  # both within test_bf16's tolerance of the fp32 model
                assert ((out - reference).norm() / reference.norm()).item() <= 0.03


def test_bucket_plans_weigh_calls_as_fp32_where_bf16_runs_on_fp32_kernels(monkeypatch):
    favour(monkeypatch, "fp32")
    assert cpu_gemm.bf16_in_fp32(CPU, torch.bfloat16)
    assert attention_call_cost(torch.bfloat16, CPU) == attention_call_cost(torch.float32, CPU) == CALL_COST
    monkeypatch.setattr(cpu_gemm, "DECISIONS", {})
    favour(monkeypatch, "mkl")
    assert not cpu_gemm.bf16_in_fp32(CPU, torch.bfloat16)
    assert attention_call_cost(torch.bfloat16, CPU) == REDUCED_PRECISION_CALL_COST
    # The plain model's planner weighs by dtype alone: it knows nothing of the kernels.
    assert default_call_cost(torch.bfloat16, CPU) == REDUCED_PRECISION_CALL_COST


# ---- the choices that still follow the CPU's capabilities ------------------------------------
# (AMX_BF16, BF16_UNITS) of each kind of CPU the choices were measured on; None: unknown.
PROFILES = {"amx": (True, True), "avx512_bf16": (False, True), "no_bf16": (False, False), "unknown": (False, None)}


def set_profile(monkeypatch, name: str) -> None:
    """Behave as on that kind of CPU, whatever this machine has."""
    amx, units = PROFILES[name]
    monkeypatch.setattr(cpu_gemm, "AMX_BF16", amx)
    monkeypatch.setattr(cpu_gemm, "BF16_UNITS", units)


@pytest.mark.skipif(cpu_gemm.CAPABILITIES is None, reason="not an x86-64 CPU: the fast path treats it as unknown")
def test_cpu_detection_reads_torch_cpu_capabilities_and_what_onednn_can_run():
    capabilities = torch.cpu.get_capabilities()
    capped = not cpu_gemm._isa_cap_allows_bf16()  # the AVX2 / AVX-512 stand-ins of .ci/run
    assert cpu_gemm.AMX_BF16 is (bool(capabilities.get("amx_bf16", False)) and not capped)
    flags = bool(capabilities.get("amx_bf16", False) or capabilities.get("avx512_bf16", False))
    runs = not cpu_gemm.ONEDNN or cpu_gemm.runnable("onednn", torch.bfloat16)
    assert cpu_gemm.BF16_UNITS is (flags and not capped and runs)


@pytest.mark.parametrize("cap, allows", [(None, True), ("ALL", True), ("AVX2", False), ("avx512_core", False),
                                         ("AVX512_CORE_VNNI", False), ("AVX512_CORE_BF16", True),
                                         ("AVX512_CORE_AMX", True), ("AVX2_VNNI_2", True)])
def test_onednn_isa_cap_decides_whether_bf16_units_count(monkeypatch, cap, allows):
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert cpu_gemm._isa_cap_allows_bf16() is allows


def test_a_kernel_the_cpu_cannot_run_is_left_out_quietly_after_one_trial(monkeypatch, caplog):
    """As oneDNN's bf16 GEMM on an AVX2-only CPU: one trial call, one debug line, no warning, never a candidate."""
    trials = []

    def no_bf16(a, *args):
        trials.append(a.dtype)
        if a.dtype == torch.bfloat16:
            raise RuntimeError("could not create a primitive descriptor for the inner product")
        return F.linear(a, args[0], args[1])

    monkeypatch.setattr(cpu_gemm, "ONEDNN", True)
    monkeypatch.setattr(cpu_gemm, "CAPABILITIES", {"cpu_name": "an AVX2 CPU"})
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", no_bf16)
    cpu_gemm.runnable.cache_clear()
    try:
        with warnings.catch_warnings(), caplog.at_level(logging.DEBUG, logger="scratchbert.cpu_gemm"):
            warnings.simplefilter("error")
            for _ in range(3):
                assert "onednn" not in cpu_gemm.candidates(gemm("forward", torch.bfloat16, inference=False))
                assert cpu_gemm.candidates(gemm("grad_input", torch.float32, inference=False)) == ["mkl", "onednn"]
            assert trials == [torch.bfloat16, torch.float32]  # one trial each, remembered
            assert set(cpu_gemm.measure(gemm("forward", torch.bfloat16, inference=False))) == {"mkl", "fp32"}
        assert [r.getMessage() for r in caplog.records if "cannot multiply" in r.getMessage()] == [
            "cpu_gemm: onednn cannot multiply in torch.bfloat16 on this CPU "
            "(could not create a primitive descriptor for the inner product); left out"]
    finally:
        cpu_gemm.runnable.cache_clear()


@pytest.mark.parametrize(
    "rows, shape, dtype, device, chunks",
    [
        (1024, (768, 768), torch.bfloat16, CPU, 2),  # 8 x 128 tokens: in the window, two chunks of 512
        (1205, (3072, 768), torch.bfloat16, CPU, 2),
        (1400, (768, 768), torch.bfloat16, CPU, 3),  # chunks of at most 640 rows
        (1400, (3072, 768), torch.bfloat16, CPU, 1),  # this shape's window ends at 1,344 rows
        (1024, (768, 768), torch.float16, CPU, 1),  # fp16 was not measured: left alone
        (640, (768, 768), torch.bfloat16, CPU, 1),  # window bounds are exclusive
        (1536, (768, 768), torch.bfloat16, CPU, 1),
        (1024, (768, 768), torch.float32, CPU, 1),  # fp32: no window
        (1024, (768, 3072), torch.bfloat16, CPU, 1),  # wide outputs: no window
        (1024, (768, 768), torch.bfloat16, torch.device("cuda"), 1),  # other devices are left alone
    ],
)
def test_row_chunks_on_amx_only_inside_the_measured_window(monkeypatch, rows, shape, dtype, device, chunks):
    set_profile(monkeypatch, "amx")
    assert cpu_gemm.row_chunks(rows, shape, device, dtype) == chunks


@pytest.mark.parametrize("profile", ["avx512_bf16", "no_bf16", "unknown"])
def test_no_row_chunks_without_amx(monkeypatch, profile):
    set_profile(monkeypatch, profile)
    assert cpu_gemm.window_chunks(1024, (768, 768)) == 2  # the window is still there to measure
    assert cpu_gemm.row_chunks(1024, (768, 768), CPU, torch.bfloat16) == 1  # but not applied


def test_amx_chunks_run_on_the_chosen_kernel_and_give_the_unsplit_result(monkeypatch):
    set_profile(monkeypatch, "amx")
    favour(monkeypatch, "onednn" if cpu_gemm.ONEDNN else "mkl")
    torch.manual_seed(0)
    layer = nn.Linear(768, 768)
    x = torch.randn(1205, 768, requires_grad=True)
    grads = []
    for linear in (cpu_gemm.linear, lambda x, layer: layer(x)):
        layer.zero_grad()
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = linear(x, layer)
        assert out.dtype == torch.bfloat16 and out.shape == (1205, 768)
        out.float().square().mean().backward()
        grads.append((out.detach().float(), x.grad.clone(), layer.weight.grad.clone()))
    assert {g.rows for g, _ in cpu_gemm.DECISIONS} == {1024}  # two chunks of 603 and 602 rows
    for chunked, unsplit in zip(*grads):
        assert relative(chunked, unsplit) <= BF16_REL


@pytest.mark.parametrize(
    "profile, dtype, autocast, stacked",
    [
        ("amx", torch.bfloat16, False, True),  # bf16 weights on AMX: one (3H, H) GEMM
        ("amx", torch.float32, True, True),  # autocast computes in bf16: stacked too
        ("amx", torch.float32, False, False),  # fp32: three GEMMs
        ("avx512_bf16", torch.bfloat16, False, False),  # no AMX: three GEMMs in every dtype
        ("avx512_bf16", torch.float32, True, False),
        ("no_bf16", torch.bfloat16, False, False),
        ("unknown", torch.bfloat16, False, False),
    ],
)
def test_stack_qkv_where_it_measured_faster(monkeypatch, profile, dtype, autocast, stacked):
    set_profile(monkeypatch, profile)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        assert cpu_gemm.stack_qkv(torch.zeros(2, 4, dtype=dtype)) is stacked
    # Off the CPU the swapped module runs what the plain one runs: three projections.
    assert cpu_gemm.stack_qkv(torch.zeros(2, 4, dtype=dtype, device="meta")) is False


@pytest.mark.parametrize(
    "profile, dtype, length, max_length, expected",
    [
        ("avx512_bf16", torch.float32, 128, 128, True),
        ("avx512_bf16", torch.bfloat16, 128, 128, True),
        ("avx512_bf16", torch.float32, 129, 128, False),  # long sequences: SDPA
        ("avx512_bf16", torch.float32, 16, 0, False),  # switched off
        ("amx", torch.float32, 16, 128, False),  # AMX CPUs: always SDPA
        ("no_bf16", torch.float32, 64, 128, True),
        ("no_bf16", torch.bfloat16, 64, 128, False),  # a bf16 bmm without bf16 units: SDPA instead
        ("unknown", torch.bfloat16, 64, 128, False),  # unknown CPU: not rerouted
        ("avx512_bf16", torch.float16, 64, 128, False),  # fp16 was not measured: SDPA
    ],
)
def test_bmm_attention_only_for_short_sequences_where_it_measured_faster(monkeypatch, profile, dtype, length, max_length, expected):
    set_profile(monkeypatch, profile)
    monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", max_length)
    assert cpu_gemm.use_bmm_attention(torch.zeros(2, 3, length, 8, dtype=dtype)) is expected


def attention_inputs(dtype=torch.float32, requires_grad=False):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 4, 7, 16, generator=gen).to(dtype).requires_grad_(requires_grad) for _ in range(3))
    keep = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [0] * 7])  # full, padded, fully padded row
    return q, k, v, modeling.additive_attention_mask(keep, dtype)


@pytest.mark.parametrize("masked", [True, False])
def test_bmm_attention_equals_the_written_out_math_and_sdpa(masked):
    q, k, v, mask = attention_inputs()
    mask = mask if masked else None
    context = bmm_attention(q, k, v, mask, 0.0)
    reference, _ = modeling.eager_attention(q, k, v, mask, 0.0)
    assert context.shape == (3, 4, 7, 16) and torch.isfinite(context).all()
    torch.testing.assert_close(context, reference, atol=1e-6, rtol=0)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(context, fused, atol=1e-6, rtol=0)


def test_bmm_attention_gradients_and_bf16():
    q, k, v, mask = attention_inputs(requires_grad=True)
    grads = []
    for attend in (bmm_attention, lambda *a: modeling.eager_attention(*a)[0]):
        attend(q, k, v, mask, 0.0).square().sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    for ours, reference in zip(*grads):
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=0)

    q16, k16, v16, mask16 = attention_inputs(torch.bfloat16)
    context = bmm_attention(q16, k16, v16, mask16, 0.0)
    assert context.dtype == torch.bfloat16 and torch.isfinite(context).all()
    reference, _ = modeling.eager_attention(*(t.detach() for t in (q, k, v)), mask, 0.0)
    torch.testing.assert_close(context.float(), reference, atol=3e-2, rtol=0)


@pytest.mark.parametrize("padded", [True, False], ids=["padding-free path", "full batch"])
def test_model_outputs_and_gradients_agree_on_every_cpu_profile(monkeypatch, padded):
    """The same model under each CPU profile (AMX, AVX-512 BF16, no bf16, unknown; bmm attention or SDPA): 1e-5 in fp32."""
    model = tiny_model()
    ids, mask = small_batch(padded)
    results = []
    for profile, max_length in (("avx512_bf16", 128), ("avx512_bf16", 0), ("amx", 128), ("no_bf16", 128), ("unknown", 0)):
        set_profile(monkeypatch, profile)
        monkeypatch.setattr(cpu_gemm, "BMM_ATTENTION_MAX_LENGTH", max_length)
        model.zero_grad()
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state * mask[..., None]
        hidden.square().sum().backward()
        results.append((hidden.detach(), model.encoder.layer[0].attention.self.query.weight.grad.clone()))
    for hidden, grad in results[1:]:
        torch.testing.assert_close(hidden, results[0][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(grad, results[0][1], atol=1e-5, rtol=0)


# ---- post-ops fused into oneDNN's GEMM (inference) --------------------------------------------
@pytest.mark.skipif(not cpu_gemm.ONEDNN, reason="this torch has no oneDNN")
@pytest.mark.parametrize("kernel", ["onednn", "onednn-packed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("post_op", cpu_gemm.POST_OPS)
def test_fused_post_op_equals_the_two_steps(monkeypatch, kernel, dtype, post_op):
    check_kernel_available(kernel, dtype)
    favour(monkeypatch, kernel)
    torch.manual_seed(0)
    layer = nn.Linear(48, 40).to(dtype)
    x, other = torch.randn(3, 7, 48, dtype=dtype), torch.randn(3, 7, 40, dtype=dtype)
    with torch.no_grad():
        fused = cpu_gemm.linear_post_op(x, layer, post_op, other if post_op == "add" else None)
        plain = F.linear(x, layer.weight, layer.bias)
        plain = F.gelu(plain) if post_op == "gelu" else plain + other
    assert fused is not None and fused.shape == plain.shape and fused.dtype == dtype
    # bf16: the fused result is rounded once, the two steps round twice (one bf16 ulp apart at most)
    tolerance = dict(atol=1e-5, rtol=0) if dtype == torch.float32 else dict(atol=2e-2, rtol=1.6e-2)
    torch.testing.assert_close(fused, plain, **tolerance)


@pytest.mark.parametrize("case", ["training", "mkl chosen", "fp32 kernel for bf16", "tracing", "other's dtype", "no other"])
def test_post_op_is_not_fused_where_it_cannot_be(monkeypatch, case):
    favour(monkeypatch, {"mkl chosen": "mkl", "fp32 kernel for bf16": "fp32"}.get(case, "onednn"))
    dtype = torch.bfloat16 if case == "fp32 kernel for bf16" else torch.float32
    layer = nn.Linear(48, 40).to(dtype)
    x, other = torch.randn(5, 48, dtype=dtype), torch.randn(5, 40, dtype=dtype)
    if case == "tracing":
        monkeypatch.setattr(cpu_gemm, "is_tracing", lambda: True)
    if case == "other's dtype":
        other = other.double()
    with torch.set_grad_enabled(case == "training"):
        assert cpu_gemm.linear_post_op(x, layer, "add", None if case == "no other" else other) is None
    with pytest.raises(ValueError, match="unknown post-op 'relu'"):
        cpu_gemm.linear_post_op(x, layer, "relu")
