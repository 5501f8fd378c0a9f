"""Which CPU kernel runs each matrix multiply of a linear layer: chosen by measurement, cached, overridable.

A linear layer with weight W (N, K) multiplies three times per training step, once in inference:

    forward       y  = x · Wᵀ + b    (M, K) · (K, N)
    grad_input    dx = g · W         (M, N) · (N, K)
    grad_weight   dW = gᵀ · x        (N, M) · (M, K)

and torch on a CPU has more than one kernel for each. Which is fastest depends on the CPU, the
dtype and the shape, and the CPUs this project has run on disagree (docs/performance.md has the
figures), so instead of a rule per CPU this module times the candidates:

    "mkl"            torch's own call (`F.linear`, `matmul`): MKL's GEMM in fp32; in bf16 torch
                     itself calls oneDNN
    "onednn"         oneDNN's matmul (`torch.ops.mkldnn._linear_pointwise`) on the weight as it is
    "onednn-packed"  the same on a copy of the weight reordered once into oneDNN's blocked layout
                     (the forward product in inference only; the copy is kept per weight and
                     rebuilt when the weight changes)
    "fp32"           bf16 only: the bf16 values widened to fp32 (exact) and multiplied by the fp32
                     kernel chosen for the same shape, the result rounded to bf16 -- a bf16 GEMM's
                     result up to summation order (oneDNN's bf16 kernels accumulate in fp32 too),
                     for CPUs without bf16 units, where torch's bf16 GEMM has no hardware

The first time a product of a given kind meets a shape bucket (rows rounded up to a power of two,
K, N), a dtype and a mode (training or inference), each available candidate runs a few times on
random operands of that shape (a bounded microbenchmark: `MEASURE_FLOPS` per call in inference,
`TRAINING_MEASURE_FLOPS` in training, at most `MEASURE_ROUNDS` rounds, ~0.05-0.3 s per bucket in
inference, up to ~0.5 s in training), and its result is checked against torch's own:
a candidate that raises or disagrees is never chosen, and one must beat "mkl" by `MARGIN` to be
proposed at all. A proposal is only that: the microbenchmark's operands can be cut to fewer rows and
sit warm in cache, a model's are not. The next real calls of that bucket alternate between the
proposal and torch's own call, `CONFIRM_CALLS` timed calls each, and the proposal is kept for the
rest of the process only if it was `MARGIN` faster on those calls too (`_Trial`). Decisions also
persist in a JSON file when `SCRATCHBERT_GEMM_CACHE` names one (keyed by CPU, torch version and
thread count).
`SCRATCHBERT_GEMM=mkl` turns all of this off (every product on torch's own call, the plain path),
`SCRATCHBERT_GEMM=onednn` forces oneDNN, `auto` (the default) measures.

A choice made by timing can differ between two runs of the same program, and in training a
different kernel (a different summation order) grows into different weights: two fine-tuning runs
with one seed end apart. Where torch's deterministic mode is on (`torch.use_deterministic_algorithms`,
which `TrainingArguments(full_determinism=True)` and `scratchbert finetune --full-determinism` turn
on), nothing is chosen by timing: `auto` acts as `mkl`, and attention runs on the candidate
training uses, without a trial. The same seed then gives the same weights, at torch's own speed.
Reproducible *and* fast: name a `SCRATCHBERT_GEMM_CACHE` file, and every run after the first
reads the first one's decisions. `scratchbert pretrain` keeps its decisions in its output folder
(`decisions_kept_in`), so `--resume` continues on the kernels the stopped run chose.

Nothing is rerouted off the CPU, for dtypes other than fp32 and bf16, for products too small to
matter (`MIN_FLOPS`), under a tracer or compiler (torch.compile, torch.export, ONNX export record
the plain `F.linear`), or on a CPU that is not x86-64 (aarch64 has no MKL and another oneDNN
build: every product is torch's own call there). Where this torch has no oneDNN, or oneDNN cannot
multiply in a dtype on this CPU (bf16 without AVX-512 BF16/AVX-512BW, found by one trial call,
`runnable`), only the kernels that can remain.

Two choices still follow the CPU's reported capabilities (`torch.cpu.get_capabilities()`; an
unknown capability means "do not reroute"), each measured on the CPU it applies to:
- with AMX, bf16 GEMMs with 768 outputs are split into row chunks inside `SLOW_ROW_WINDOWS`;
- with AMX, in bf16, queries, keys and values come from one stacked GEMM (`stack_qkv`).
Attention over short sequences on CPUs without AMX has two candidates, SDPA and two batched GEMMs
(`use_bmm_attention`), and real calls decide between them as they decide a GEMM's kernel
(`attention_kernel`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import platform
import statistics
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from .bert_padding import autocast_dtype, is_tracing

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# What this CPU and this torch report
# --------------------------------------------------------------------------------------------
# The kernels below, and the capability rules at the end of this file, were measured and tested on
# x86-64 CPUs (Intel with AMX; AMD Zen 3, 4 and 5). Elsewhere (aarch64: no MKL, another oneDNN
# build) the CPU counts as unknown and every product takes torch's own call.
KNOWN_ARCHITECTURES = ("x86_64", "amd64")


def _capabilities() -> dict | None:
    """`torch.cpu.get_capabilities()` (public since torch 2.6) on x86-64, or None where torch cannot say."""
    get = getattr(torch.cpu, "get_capabilities", None)
    if get is None or platform.machine().lower() not in KNOWN_ARCHITECTURES:
        return None
    try:
        return get()
    except Exception:  # noqa: BLE001 -- an unreadable CPU is an unknown one
        return None


def _onednn_available() -> bool:
    """Whether this torch can call oneDNN's matmul directly (the "onednn" kernels)."""
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        return (torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")
                and hasattr(ops, "_reorder_linear_weight"))
    except Exception:  # noqa: BLE001 -- a torch built without oneDNN
        return False


CAPABILITIES: dict | None = _capabilities()
ONEDNN: bool = _onednn_available()


@functools.cache
def runnable(kernel: str, dtype: torch.dtype) -> bool:
    """Whether `kernel` can multiply in `dtype` on this CPU: found once, by one small trial call.

    A CPU's flags do not settle it: oneDNN's bf16 kernels need AVX-512 BF16/AVX-512BW or
    AVX-NE-CONVERT, and oneDNN can be held below the CPU's own instruction set
    (`ONEDNN_MAX_CPU_ISA`). A kernel that raises, or disagrees with torch's own call, is left out
    quietly: one debug line, no warning per shape.
    """
    if kernel == "mkl":
        return True
    if kernel == "fp32":
        return dtype == torch.bfloat16
    if kernel not in ("onednn", "onednn-packed") or not ONEDNN:
        return False
    gen = torch.Generator().manual_seed(0)
    a, b, bias = (torch.randn(*shape, generator=gen).to(dtype) for shape in ((16, 32), (24, 32), (24,)))
    try:
        with torch.inference_mode(False), torch.no_grad(), torch.autocast("cpu", enabled=False):
            if kernel == "onednn":
                out = torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")
            else:
                out = torch.ops.mkldnn._linear_pointwise(a, torch.ops.mkldnn._reorder_linear_weight(b, None), bias,
                                                         "none", [], "")
            torch.testing.assert_close(out.float(), F.linear(a, b, bias).float(), rtol=2e-2, atol=2e-2)
    except Exception as error:  # noqa: BLE001 -- whatever the reason, this kernel is out
        logger.debug("cpu_gemm: %s cannot multiply in %s on this CPU (%s); left out", kernel, dtype, error)
        return False
    return True


def _isa_cap_allows_bf16() -> bool:
    """Whether oneDNN's instruction-set cap (`ONEDNN_MAX_CPU_ISA`, if set) leaves it bf16 instructions.

    The cap holds oneDNN below the CPU's own set, and torch's bf16 GEMMs are oneDNN's: capped at
    AVX512_CORE (Skylake) or AVX2, a CPU with AVX-512 BF16 or AMX multiplies bf16 as one without
    bf16 units does (emulated, or not at all). Unset, DEFAULT or ALL: no cap.
    """
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    return cap in ("ALL", "DEFAULT") or "BF16" in cap or "AMX" in cap or cap.startswith(("AVX10", "AVX2_VNNI_2"))


AMX_BF16: bool = bool(CAPABILITIES and CAPABILITIES.get("amx_bf16", False)) and _isa_cap_allows_bf16()
# Whether torch's bf16 kernels have hardware here: the CPU says so, oneDNN's cap allows it, and a
# trial call runs (without them, as on AVX2-only CPUs, oneDNN has no bf16 GEMM at all). None: unknown.
BF16_UNITS: bool | None = None if CAPABILITIES is None else bool(
    (CAPABILITIES.get("amx_bf16", False) or CAPABILITIES.get("avx512_bf16", False))
    and _isa_cap_allows_bf16() and (not ONEDNN or runnable("onednn", torch.bfloat16)))

# --------------------------------------------------------------------------------------------
# The kernels
# --------------------------------------------------------------------------------------------
PRODUCTS = ("forward", "grad_input", "grad_weight")
KERNELS = ("mkl", "onednn", "onednn-packed", "fp32")
OVERRIDES = ("auto", "mkl", "onednn")

MIN_FLOPS = 2 * 64 * 768 * 768  # smaller products stay on torch's call: a measurement would not pay
MEASURE_FLOPS = 1e9  # per timed inference call: ~5 ms at 200 GFLOP/s (the row count is cut to fit; real calls then confirm)
# Per timed training call, where no trial on real calls follows: ~60 ms at 330 GFLOP/s, all of a
# bert-base layer's 2,048-row products uncut. Cut to ~200 rows, the 768 -> 3,072 product ran 12% faster
# on oneDNN than on MKL; at its 2,048 rows 3% slower (an Intel Xeon with AVX-512, docs/performance.md).
TRAINING_MEASURE_FLOPS = 2e10
MEASURE_ROUNDS = 5
MEASURE_BUDGET_S = 0.05  # per bucket, after the second round
DROP_AFTER_ONE_ROUND = 1.5  # a candidate this many times slower than the best after one round is out
MARGIN = 0.05  # another kernel must be this much faster than "mkl" to be chosen
CONFIRM_CALLS = 3  # real calls timed on each of the proposal and "mkl" before a decision is final


OPTIMIZER_STEPS = 0  # optimizer steps taken in this process, by any torch optimizer (`_count_optimizer_step`)


def _count_optimizer_step(optimizer, args, kwargs) -> None:
    global OPTIMIZER_STEPS
    OPTIMIZER_STEPS += 1


# A global hook: it runs after every `step()` of every torch.optim optimizer in the process.
register_optimizer_step_post_hook(_count_optimizer_step)

SAMPLED_VALUES = 16  # values of a weight compared on each call with those its packed copy was made from


class _PackedWeights:
    """Each weight's copy in oneDNN's blocked layout, per dtype, rebuilt when the weight changes.

    Keyed by the weight tensor's id with a weak reference (a tensor's `==` is elementwise, so
    tensors cannot key a dict); the entry dies with the weight. Four things tell that the weight
    may have changed since its copy was made, and any of them rebuilds it:
    - its `_version`: every in-place op through torch's dispatcher bumps it (a plain optimizer
      step, `load_state_dict`, `mul_` under `no_grad`);
    - its `data_ptr`: a new storage;
    - an optimizer step anywhere in the process (`OPTIMIZER_STEPS`): torch's fused AdamW, the
      default optimizer of `Trainer` (`adamw_torch_fused`) and of `scratchbert pretrain`, writes
      the weights without bumping `_version`, so an evaluation between training steps would
      otherwise multiply by the weights of the first evaluation;
    - `SAMPLED_VALUES` of its values, spread over it: an edit through `.data`, which has a version
      counter of its own, that changes the whole weight (an average of weights, a re-initialisation).
    """

    def __init__(self):
        self.entries: dict[tuple[int, torch.dtype, bool], tuple] = {}

    @staticmethod
    def sample(weight: torch.Tensor) -> torch.Tensor:
        flat = weight.detach().reshape(-1)
        return flat[:: max(1, flat.numel() // SAMPLED_VALUES)][:SAMPLED_VALUES].clone()

    def get(self, weight: torch.Tensor, dtype: torch.dtype, bf16_values: bool) -> torch.Tensor:
        def pack() -> torch.Tensor:  # only on a miss: a cache hit reads 16 values, not the weight
            values = weight.detach().to(torch.bfloat16) if bf16_values else weight.detach()
            return torch.ops.mkldnn._reorder_linear_weight(values.to(dtype).contiguous(), None)

        if weight.is_inference():  # made under inference_mode: no version counter to watch, so no copy kept
            return pack()
        key = (id(weight), dtype, bf16_values)
        stamp, sample = (weight._version, weight.data_ptr(), OPTIMIZER_STEPS), self.sample(weight)
        entry = self.entries.get(key)
        if entry is not None and entry[0]() is weight and entry[1] == stamp and torch.equal(entry[2], sample):
            return entry[3]
        packed = pack()
        entries = self.entries
        ref = weakref.ref(weight, lambda _, key=key: entries.pop(key, None))
        self.entries[key] = (ref, stamp, sample, packed)
        return packed


PACKED = _PackedWeights()


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype)


def _multiply(kernel: str, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
              weight: torch.Tensor | None = None, bf16_values: bool = False) -> torch.Tensor:
    """a (M, K) · b (N, K)ᵀ + bias (N,) -> (M, N) on one kernel, in a's dtype; a and b may be transposed views.

    b and bias are cast to a's dtype (a no-op when they have it). weight: the layer's weight, for
    "onednn-packed", which multiplies its cached packed copy instead of b; bf16_values: the copy
    must hold the weight's bf16 values widened to fp32 (the "fp32" kernel).
    """
    if kernel == "onednn-packed":
        return torch.ops.mkldnn._linear_pointwise(a, PACKED.get(weight, a.dtype, bf16_values), _cast(bias, a.dtype),
                                                  "none", [], "")
    b, bias = _cast(b, a.dtype), _cast(bias, a.dtype)
    if kernel == "mkl":
        return F.linear(a, b, bias)
    if kernel == "onednn":
        return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")
    raise ValueError(f"unknown GEMM kernel {kernel!r}; one of {KERNELS}")


@dataclass(frozen=True)
class Gemm:
    """One kind of product at one shape bucket: what a kernel decision is keyed by.

    rows: the layer's input rows M, rounded up to a power of two; k, n: the layer's in and out
    features; inference: no gradient is being recorded (the packed weight is then a candidate).
    """

    product: str
    rows: int
    k: int
    n: int
    dtype: torch.dtype
    inference: bool

    def flops(self, rows: int | None = None) -> float:
        return 2.0 * (rows or self.rows) * self.k * self.n

    def key(self) -> str:
        cpu = (CAPABILITIES or {}).get("cpu_name", "unknown CPU")
        mode = "inference" if self.inference else "training"
        return (f"{cpu}|torch {torch.__version__}|{torch.get_num_threads()} threads|{self.product}|"
                f"{self.rows}x{self.k}x{self.n}|{str(self.dtype).removeprefix('torch.')}|{mode}")


def candidates(gemm: Gemm) -> list[str]:
    """The kernels that can run `gemm` here, "mkl" (torch's own call) first; only "mkl" on an unknown CPU."""
    if CAPABILITIES is None:
        return ["mkl"]
    found = ["mkl"]
    if ONEDNN and torch.backends.mkldnn.enabled:
        found.append("onednn")
        if gemm.inference and gemm.product == "forward":
            found.append("onednn-packed")
    if gemm.dtype == torch.bfloat16:
        found.append("fp32")
    return [kernel for kernel in found if runnable(kernel, gemm.dtype)]


def _run(gemm: Gemm, kernel: str, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
         weight: torch.Tensor | None = None, bf16_values: bool = False) -> torch.Tensor:
    """`gemm`'s product on `kernel`: a (M, K) · b (N, K)ᵀ + bias -> (M, N), in a's dtype (see `_multiply`).

    "fp32" runs the same product in fp32 on the fp32 kernel chosen for it (`_run_chosen`).
    """
    if kernel != "fp32":
        return _multiply(kernel, a, b, bias, weight, bf16_values)
    inner = Gemm(gemm.product, gemm.rows, gemm.k, gemm.n, torch.float32, gemm.inference)
    widen = lambda t: None if t is None else t.to(torch.bfloat16).float()  # noqa: E731 -- bf16 -> fp32 is exact
    with torch.autocast("cpu", enabled=False):  # or autocast would send the fp32 call back to bf16
        return _run_chosen(inner, widen(a), widen(b), widen(bias), weight, bf16_values=True).to(a.dtype)


# --------------------------------------------------------------------------------------------
# Choosing: measure once per bucket, remember
# --------------------------------------------------------------------------------------------
@dataclass
class _Trial:
    """A proposed kernel on trial against torch's own call (`baseline`) on a bucket's real calls.

    The two take turns, and each call's seconds per unit of work (rows of a GEMM) are kept (calls
    in one bucket differ in size); after `CONFIRM_CALLS` calls each, the proposal wins if its
    median is `MARGIN` below the baseline's. Alternating calls share the model's state: the same
    weights, as cold or warm in cache as the model leaves them, the same other load on the cores.

    Inference only: in training, alternating kernels would make a run's numbers depend on when
    each trial ended, and a resumed run must end with the weights of an uninterrupted one
    (training keeps the microbenchmark's pick, and the two-GEMM attention where it is a candidate).
    """

    kernel: str
    baseline: str = "mkl"
    seconds_per_row: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self):
        self.seconds_per_row = {self.kernel: [], self.baseline: []}

    def next_kernel(self) -> str:
        mine, theirs = (len(self.seconds_per_row[k]) for k in (self.kernel, self.baseline))
        return self.kernel if mine <= theirs else self.baseline

    def record(self, kernel: str, seconds: float, rows: int) -> str | None:
        """Add one timed call; the decision once both kernels have `CONFIRM_CALLS` calls, else None."""
        self.seconds_per_row[kernel].append(seconds / max(rows, 1))
        if min(len(times) for times in self.seconds_per_row.values()) < CONFIRM_CALLS:
            return None
        mine, theirs = (statistics.median(self.seconds_per_row[k]) for k in (self.kernel, self.baseline))
        return self.kernel if mine <= (1 - MARGIN) * theirs else self.baseline


DECISIONS: dict[tuple[Gemm, int], str] = {}  # (gemm, torch threads) -> kernel
TRIALS: dict[tuple[Gemm, int], _Trial] = {}  # (gemm, torch threads) -> a proposal still on trial
_disk: dict[str, dict[str, str]] = {}  # path -> its decisions, read once
_kept_in: list[Path] = []  # the files of the `decisions_kept_in` blocks open now, innermost last


def _override() -> str:
    """`SCRATCHBERT_GEMM`; "auto" reads as "mkl" in torch's deterministic mode (no choice by timing)."""
    value = os.environ.get("SCRATCHBERT_GEMM", "auto").strip().lower() or "auto"
    if value not in OVERRIDES:
        raise ValueError(f"SCRATCHBERT_GEMM={value!r}: use one of {', '.join(OVERRIDES)} "
                         "(auto measures; mkl is torch's own call everywhere; onednn forces oneDNN)")
    if value == "auto" and torch.are_deterministic_algorithms_enabled():
        return "mkl"
    return value


@contextlib.contextmanager
def decisions_kept_in(path: str | Path):
    """Within the block, keep every decision in the JSON file `path`, and take those already there.

    What `SCRATCHBERT_GEMM_CACHE` does for a whole process (and when it is set, it wins), for one
    piece of work: `scratchbert pretrain` keeps its run's decisions in its output folder, so a
    resumed run multiplies on the kernels the stopped one chose instead of timing them again, and
    ends with the weights of an uninterrupted run (a kernel chosen otherwise sums in another order).
    """
    path = Path(path)
    _disk.pop(str(path), None)  # read afresh: the folder may have been cleared since
    _kept_in.append(path)
    try:
        yield
    finally:
        _kept_in.remove(path)


@contextlib.contextmanager
def decisions_forgotten():
    """Within the block, kernels are chosen as usual; after it, what was decided in it is forgotten.

    For a trial run (`training.precision` times a few throwaway training steps): its decisions
    must not stand in for a real run's, which keeps its own in its output folder (above) so that
    a resumed run sums in the same order. Nothing decided in the block is written to that folder.
    """
    tables = (DECISIONS, TRIALS, ATTENTION_DECISIONS, ATTENTION_TRIALS)
    before, kept_in = [dict(table) for table in tables], list(_kept_in)
    _kept_in.clear()
    try:
        yield
    finally:
        for table, entries in zip(tables, before):
            table.clear()
            table.update(entries)
        _kept_in[:] = kept_in


def _disk_decisions() -> tuple[Path | None, dict[str, str]]:
    path = os.environ.get("SCRATCHBERT_GEMM_CACHE") or (str(_kept_in[-1]) if _kept_in else None)
    if not path:
        return None, {}
    if path not in _disk:
        try:
            _disk[path] = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            _disk[path] = {}
    return Path(path), _disk[path]


def _operands(gemm: Gemm, rows: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Random operands of M = rows, N = n, laid out as the layer's autograd passes them: (a, b, bias, weight)."""
    gen = torch.Generator().manual_seed(0)
    uniform = lambda *shape: torch.empty(*shape, dtype=gemm.dtype).uniform_(-1, 1, generator=gen)  # noqa: E731
    weight = uniform(n, gemm.k)  # (N, K)
    if gemm.product == "forward":
        return uniform(rows, gemm.k), weight, uniform(n), weight
    grad = uniform(rows, n)  # (M, N)
    if gemm.product == "grad_input":
        return grad, weight.t(), None, weight  # g (M, N) · W (N, K)
    return grad.t(), uniform(rows, gemm.k).t(), None, weight  # gᵀ (N, M) · x (M, K)


def measure(gemm: Gemm, rows: int | None = None, rounds: int = MEASURE_ROUNDS,
            budget_s: float = MEASURE_BUDGET_S) -> dict[str, float]:
    """Seconds per call of each candidate that runs `gemm` correctly (best of `rounds`; bounded).

    A call is cut to at most `MEASURE_FLOPS` in inference, where the proposal is then tried on real
    calls, and `TRAINING_MEASURE_FLOPS` in training, where it is not: the forward and grad_input lose
    rows (at least 64 are kept), grad_weight, whose inner dimension the rows are, loses output
    features N instead. rows: time at this many rows, uncut. After the first round, a candidate
    more than `DROP_AFTER_ONE_ROUND` times slower than the best is not timed again; the rounds stop
    once `budget_s` has passed after the second.
    A candidate that raises, or whose result is not torch's own to rounding, is left out.
    """
    n = gemm.n
    if rows is None:
        cap = MEASURE_FLOPS if gemm.inference else TRAINING_MEASURE_FLOPS
        fit = lambda size: max(min(size, int(cap // (gemm.flops(1) * gemm.rows / size))), min(size, 64))  # noqa: E731
        rows, n = (gemm.rows, fit(gemm.n)) if gemm.product == "grad_weight" else (fit(gemm.rows), gemm.n)
    tolerance = 1e-4 if gemm.dtype == torch.float32 else 2e-2  # relative, over the whole result
    # Outside inference_mode even inside one: the packed copy of an inference tensor is not kept.
    with torch.inference_mode(False), torch.no_grad(), torch.autocast("cpu", enabled=False):
        a, b, bias, weight = _operands(gemm, rows, n)
        reference = _run(gemm, "mkl", a, b, bias, weight).float()
        working = []
        for kernel in candidates(gemm):
            try:
                out = _run(gemm, kernel, a, b, bias, weight).float()  # also the warm-up
            except Exception:  # noqa: BLE001 -- a kernel this build or CPU cannot run
                continue
            if out.shape == reference.shape and (out - reference).norm() <= tolerance * reference.norm():
                working.append(kernel)
        best = {kernel: math.inf for kernel in working}
        start = time.perf_counter()
        for round_ in range(rounds):
            for kernel in working:  # interleaved, so a burst of load hits every candidate alike
                begin = time.perf_counter()
                _run(gemm, kernel, a, b, bias, weight)
                best[kernel] = min(best[kernel], time.perf_counter() - begin)
            if round_ == 0:
                fastest = min(best.values())
                working = [k for k in working if best[k] <= DROP_AFTER_ONE_ROUND * fastest]
            if round_ >= 1 and time.perf_counter() - start > budget_s:
                break
    return best


def _decide(gemm: Gemm, kernel: str) -> None:
    """Make `kernel` the decision for `gemm` in this process, and in the disk cache if one is named."""
    DECISIONS[(gemm, torch.get_num_threads())] = kernel
    path, saved = _disk_decisions()
    if path is not None and saved.get(gemm.key()) != kernel:
        saved[gemm.key()] = kernel
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(saved, indent=1, sort_keys=True))
            os.replace(tmp, path)  # whole or not at all: a reader never sees half a file
        except OSError as error:  # the decision stands for this process; only its record is lost
            _warn_once(f"cpu_gemm: cannot write kernel decisions to {path} ({error}); they are kept in this process only")


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def propose(gemm: Gemm) -> str:
    """The microbenchmark's pick for `gemm`: the fastest candidate, "mkl" unless another is `MARGIN` faster."""
    times = measure(gemm)
    kernel = min(times, key=times.get) if times else "mkl"
    if kernel != "mkl" and "mkl" in times and times[kernel] > (1 - MARGIN) * times["mkl"]:
        kernel = "mkl"  # not a clear win: do not reroute
    return kernel


def choose(gemm: Gemm) -> str:
    """The kernel to run `gemm` on now: forced by `SCRATCHBERT_GEMM`, else the remembered decision,
    else (a bucket met for the first time) the disk cache's or the microbenchmark's; a proposal other
    than "mkl" is on trial for its first real calls (`_Trial`), and this returns whose turn it is."""
    override = _override()
    memo = (gemm, torch.get_num_threads())  # the fastest kernel can change with the thread count
    if override == "auto" and memo in DECISIONS:
        return DECISIONS[memo]
    if override == "auto" and memo in TRIALS:
        return TRIALS[memo].next_kernel()
    available = candidates(gemm)
    if override == "onednn":
        if "onednn" not in available:
            _warn_once(f"SCRATCHBERT_GEMM=onednn, but this torch cannot call oneDNN in {gemm.dtype} on this CPU: "
                       "using torch's own call")
            return "mkl"
        return "onednn-packed" if "onednn-packed" in available else "onednn"
    if override == "mkl" or available == ["mkl"]:
        return "mkl"
    _, saved = _disk_decisions()
    kernel = saved.get(gemm.key())
    if kernel in available:  # decided on real calls in an earlier process
        DECISIONS[memo] = kernel
        return kernel
    kernel = propose(gemm)
    if kernel == "mkl" or CONFIRM_CALLS <= 0 or not gemm.inference:
        _decide(gemm, kernel)  # training: no trial (see `_Trial`)
        return kernel
    TRIALS[memo] = _Trial(kernel)
    return TRIALS[memo].next_kernel()


def preferred(gemm: Gemm) -> str:
    """The kernel `gemm` runs on once settled: the decision, or while on trial the proposal."""
    kernel = choose(gemm)
    trial = TRIALS.get((gemm, torch.get_num_threads()))
    return kernel if trial is None else trial.kernel


def settled(gemm: Gemm) -> str | None:
    """The decided kernel for `gemm`, or None while its proposal is on trial."""
    kernel = choose(gemm)
    return None if (gemm, torch.get_num_threads()) in TRIALS else kernel


def _run_chosen(gemm: Gemm, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
                weight: torch.Tensor | None = None, bf16_values: bool = False) -> torch.Tensor:
    """`gemm`'s product on its chosen kernel (timed, while on trial); should that kernel fail on a real
    call, torch's own call runs instead, now and for the rest of the process (its error, if any, is the caller's)."""
    kernel = choose(gemm)
    memo = (gemm, torch.get_num_threads())
    trial = TRIALS.get(memo)
    if kernel == "mkl" and trial is None:
        return _run(gemm, "mkl", a, b, bias, weight, bf16_values)
    try:
        start = time.perf_counter()
        out = _run(gemm, kernel, a, b, bias, weight, bf16_values)
        seconds = time.perf_counter() - start
    except Exception as error:  # noqa: BLE001 -- any kernel failure falls back to the plain call
        warnings.warn(f"cpu_gemm: {kernel} failed on {gemm} ({error!r}); using torch's own call instead")
        TRIALS.pop(memo, None)
        DECISIONS[memo] = "mkl"
        return _run(gemm, "mkl", a, b, bias, weight, bf16_values)
    if trial is not None:
        decision = trial.record(kernel, seconds, a.size(0))
        if decision is not None:
            del TRIALS[memo]
            _decide(gemm, decision)
            logger.debug("cpu_gemm: %s on %s after real calls (seconds per row %s)", decision, gemm, trial.seconds_per_row)
    return out


def bucket(rows: int) -> int:
    """Rows rounded up to a power of two: the row part of a decision's key."""
    return 1 << max(rows - 1, 0).bit_length()


# --------------------------------------------------------------------------------------------
# The linear layer
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    """The three products of one training call: their decision keys."""

    forward: Gemm
    grad_input: Gemm
    grad_weight: Gemm


class _MeasuredLinear(torch.autograd.Function):
    """y = x · Wᵀ + b whose backward products run on their chosen kernels too.

    x (M, K), weight (N, K), bias (N,) or None, all in the compute dtype -> (M, N).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, plan: _Plan):
        ctx.save_for_backward(x, weight)
        ctx.plan = plan
        ctx.has_bias = bias is not None
        return _run_chosen(plan.forward, x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        plan = ctx.plan
        grad = grad.contiguous()  # (M, N)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _run_chosen(plan.grad_input, grad, weight.t(), None)  # (M, K)
        if ctx.needs_input_grad[1]:
            grad_w = _run_chosen(plan.grad_weight, grad.t(), x.t(), None)  # (N, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0)  # (N,)
        return grad_x, grad_w, grad_b, None


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the matrix multiply will run in: the autocast dtype when autocast is on."""
    return autocast_dtype(x.device) or x.dtype


def linear_weights(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, (..., K) -> (..., N), each product on its measured kernel.

    Equal to `F.linear` up to floating-point summation order, forward and backward, with fp32 or
    bf16 weights and under bf16 autocast (the output then bf16, the gradients of fp32 weights
    fp32, as autocast's).
    """
    dtype = _compute_dtype(x)
    autocast = autocast_dtype(x.device) is not None
    rows = x.numel() // x.size(-1) if x.dim() else 0
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    floats = (torch.float32, torch.bfloat16)
    same_dtype = x.dtype == weight.dtype == dtype and (bias is None or bias.dtype == dtype)
    if (x.device.type != "cpu" or CAPABILITIES is None or dtype not in floats or is_tracing() or _override() == "mkl"
            or 2.0 * rows * k * n < MIN_FLOPS
            or not (same_dtype or (autocast and x.dtype in floats and weight.dtype in floats))):
        return F.linear(x, weight, bias)
    size = bucket(rows)
    flat = x.reshape(rows, k).to(dtype)  # (M, K); under autocast cast as autocast would
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        plan = _Plan(*(Gemm(product, size, k, n, dtype, False) for product in PRODUCTS))
        # The casts (no-ops without autocast) carry the gradients back to fp32 weights.
        out = _MeasuredLinear.apply(flat, weight.to(dtype), _cast(bias, dtype), plan)
    else:
        gemm = Gemm("forward", size, k, n, dtype, True)
        out = _run_chosen(gemm, flat, weight, bias, weight)  # casts b as needed; packed: never
    return out.view(*x.shape[:-1], n)


# AMX only: (in_features, out_features) -> (low, high): a bf16 GEMM of that shape with
# low < rows < high is split into chunks of at most `low` rows (measured on bert-base's two
# 768-output projections; docs/performance.md).
SLOW_ROW_WINDOWS: dict[tuple[int, int], tuple[int, int]] = {(768, 768): (640, 1536), (3072, 768): (640, 1344)}


def window_chunks(rows: int, shape: tuple[int, int]) -> int:
    """How many chunks `SLOW_ROW_WINDOWS` splits `rows` into for a GEMM of shape (in, out); 1 = none."""
    window = SLOW_ROW_WINDOWS.get(shape)
    if window is None:
        return 1
    low, high = window
    return math.ceil(rows / low) if low < rows < high else 1


def row_chunks(rows: int, shape: tuple[int, int], device: torch.device, dtype: torch.dtype) -> int:
    """How many chunks to split `rows` into (1 = no split) for a GEMM of shape (in_features, out_features)."""
    amx_bf16 = AMX_BF16 and device.type == "cpu" and dtype == torch.bfloat16
    return window_chunks(rows, shape) if amx_bf16 else 1


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """`layer(x)`, (..., in_features) -> (..., out_features), each product on its measured kernel.

    On AMX CPUs in bf16, in row chunks where oneDNN's GEMM is slow for the row count.
    """
    rows = x.numel() // x.size(-1) if x.dim() else 0
    chunks = row_chunks(rows, (layer.in_features, layer.out_features), x.device, _compute_dtype(x))
    if chunks == 1:
        return linear_weights(x, layer.weight, layer.bias)
    flat = x.reshape(rows, x.size(-1))  # (M, in)
    out = torch.cat([linear_weights(part, layer.weight, layer.bias) for part in flat.chunk(chunks)])  # (M, out)
    return out.view(*x.shape[:-1], layer.out_features)


POST_OPS = ("gelu", "add")  # what `linear_post_op` can fuse into oneDNN's GEMM


def linear_post_op(x: torch.Tensor, layer: nn.Linear, post_op: str, other: torch.Tensor | None = None) -> torch.Tensor | None:
    """`F.gelu(layer(x))` ("gelu", erf GELU) or `layer(x) + other` ("add"), fused into the GEMM; None where not.

    Inference only: where no gradient is recorded and the forward product's kernel is decided
    (not on trial) and is oneDNN's, the GELU or the addition runs as the GEMM's post-op, on each output tile while it
    is still in cache, instead of as a second pass over the (M, N) output. Everywhere else
    (training, torch's own kernel chosen, bf16 on the fp32 kernel, AMX row chunks, a tracer,
    `other` in another dtype than the product) it returns None and the caller runs the two steps.
    """
    if post_op not in POST_OPS:
        raise ValueError(f"unknown post-op {post_op!r}; one of {POST_OPS}")
    dtype = _compute_dtype(x)
    rows = x.numel() // x.size(-1) if x.dim() else 0
    k, n = layer.in_features, layer.out_features
    if (x.device.type != "cpu" or CAPABILITIES is None or dtype not in (torch.float32, torch.bfloat16) or is_tracing()
            or _override() == "mkl" or torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, layer.weight, layer.bias))
            or 2.0 * rows * k * n < MIN_FLOPS or row_chunks(rows, (k, n), x.device, dtype) > 1
            or (other is None) is (post_op == "add") or (other is not None and other.dtype != dtype)):
        return None
    gemm = Gemm("forward", bucket(rows), k, n, dtype, True)
    kernel = settled(gemm)  # while oneDNN is on trial, the plain product runs (and is timed)
    if kernel not in ("onednn", "onednn-packed"):
        return None
    flat = x.reshape(rows, k).to(dtype)  # (M, K)
    weight = PACKED.get(layer.weight, dtype, False) if kernel == "onednn-packed" else layer.weight.to(dtype)
    bias = _cast(layer.bias, dtype)
    if post_op == "gelu":
        out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "gelu", [], "none")  # "none": erf, not tanh
    else:
        out = torch.ops.mkldnn._linear_pointwise.binary(flat, other.reshape(rows, n), weight, bias, "add")
    return out.view(*x.shape[:-1], n)


class MeasuredLinear(nn.Linear):
    """An `nn.Linear` whose products run on their measured kernels: the same parameters and state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self)

    def extra_repr(self) -> str:  # what print(model) shows: where the product runs
        return f"{super().extra_repr()}, kernel=measured (cpu_gemm.py)"


def bf16_in_fp32(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether bf16 matrix multiplies on `device` run on fp32 kernels (measured at bert-base's feed-forward shape).

    True on CPUs where torch's bf16 GEMM has no hardware; `cpu_kernels.attention_call_cost` then
    weighs attention calls as in fp32.
    """
    if device.type != "cpu" or CAPABILITIES is None or dtype != torch.bfloat16 or _override() == "mkl":
        return False
    return preferred(Gemm("forward", 512, 768, 3072, torch.bfloat16, True)) == "fp32"


# --------------------------------------------------------------------------------------------
# Attention and the Q/K/V projection
# --------------------------------------------------------------------------------------------
# Sequences up to this length may attend through `bmm_attention`'s two batched GEMMs instead of
# SDPA on CPUs without AMX, in fp32, and in bf16 where the CPU has bf16 units (0 turns it off; so
# does an unknown CPU); in inference real calls decide (`attention_kernel`). Measured on bert-base
# heads: faster up to 128 tokens with bf16 units, up to 96 without (docs/performance.md).
BMM_ATTENTION_MAX_LENGTH = 0 if BF16_UNITS is None else 128 if BF16_UNITS else 96


def stack_qkv(x: torch.Tensor) -> bool:
    """Whether to compute queries, keys and values from one stacked (3H, H) GEMM for input `x`.

    Yes on AMX CPUs in bf16, where it measured faster; no on other CPUs, where three GEMMs
    measured as fast without the per-call weight concatenation, and off the CPU, where the
    swapped modules run what the plain ones run.
    """
    return x.device.type == "cpu" and AMX_BF16 and _compute_dtype(x) == torch.bfloat16


def use_bmm_attention(query: torch.Tensor) -> bool:
    """Whether two batched GEMMs are a candidate for attention over query (..., L, D), beside SDPA.

    On CPUs without AMX, for L <= `BMM_ATTENTION_MAX_LENGTH`, in fp32, and in bf16 only where the
    CPU has bf16 units (elsewhere a bf16 `bmm` is many times slower than SDPA's kernel). Whether
    the candidate is used is measured on real calls (`attention_kernel`).
    """
    if query.device.type != "cpu" or AMX_BF16 or query.size(-2) > BMM_ATTENTION_MAX_LENGTH:
        return False
    return query.dtype == torch.float32 or (query.dtype == torch.bfloat16 and bool(BF16_UNITS))


# (length bucket, head dim, dtype, training, torch threads) -> "bmm" or "sdpa", and the trials
ATTENTION_DECISIONS: dict[tuple, str] = {}
ATTENTION_TRIALS: dict[tuple, _Trial] = {}


def _attention_key(query: torch.Tensor) -> tuple:
    return (bucket(query.size(-2)), query.size(-1), query.dtype, torch.is_grad_enabled(), torch.get_num_threads())


def attention_kernel(query: torch.Tensor) -> str:
    """"bmm" (`cpu_kernels.bmm_attention`) or "sdpa" for attention over query (..., L, D), this call.

    Where two batched GEMMs are a candidate (`use_bmm_attention`), the first real calls of each
    length bucket alternate between them and SDPA, `CONFIRM_CALLS` timed calls each (time per
    sequence-head and squared length), and the GEMMs stay only if `MARGIN` faster. A rule per CPU
    kind had them win on one CPU and lose on another. In training, and in torch's deterministic
    mode, the candidate is used (no trial: see `_Trial`).
    """
    if not use_bmm_attention(query):
        return "sdpa"
    key = _attention_key(query)
    if key in ATTENTION_DECISIONS:
        return ATTENTION_DECISIONS[key]
    if CONFIRM_CALLS <= 0 or torch.is_grad_enabled() or torch.are_deterministic_algorithms_enabled():
        return "bmm"  # training or deterministic mode: no trial (see `_Trial`)
    return ATTENTION_TRIALS.setdefault(key, _Trial("bmm", baseline="sdpa")).next_kernel()


def record_attention(query: torch.Tensor, kernel: str, seconds: float) -> None:
    """Count one timed attention call toward its bucket's trial, if one is open."""
    if not ATTENTION_TRIALS:  # the usual case once decided: no key to build on every call
        return
    key = _attention_key(query)
    trial = ATTENTION_TRIALS.get(key)
    if trial is None:
        return
    work = query[..., 0, 0].numel() * query.size(-2) ** 2  # sequence-heads x L^2
    decision = trial.record(kernel, seconds, work)
    if decision is not None:
        del ATTENTION_TRIALS[key]
        ATTENTION_DECISIONS[key] = decision
        logger.debug("cpu_gemm: attention %s for %s after real calls (seconds per unit %s)", decision, key, trial.seconds_per_row)
