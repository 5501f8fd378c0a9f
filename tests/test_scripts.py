"""The benchmark scripts run, validate their arguments, and report which CPU choices they measured."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scratchbert import cpu_gemm

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def run_script(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_bench_gemm_times_every_kernel_and_names_the_choice():
    result = run_script("scripts/bench_gemm.py", "--rows", "256", "--repeats", "1", "--shapes", "attention")
    assert result.returncode == 0, result.stderr
    header, columns, _, *rows = result.stdout.strip().splitlines()
    assert ("AMX" in header and "no AMX" not in header) is cpu_gemm.AMX_BF16
    assert columns.split("|")[5:-2] == [f" {kernel} " for kernel in cpu_gemm.KERNELS]
    assert len(rows) == 2 * 4  # fp32 and bf16, four products
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        dtype, product, timings, chosen = cells[0], cells[2], cells[4:-1], cells[-1]
        assert chosen.split()[0] in cpu_gemm.KERNELS
        assert timings[0] != "–"  # torch's own call always runs
        prepacked = cpu_gemm.runnable("onednn-packed", torch.float32 if dtype == "fp32" else torch.bfloat16)
        assert (timings[2] != "–") is (prepacked and product == "forward, inference")  # inference only, where it runs
        assert (timings[3] != "–") is (dtype == "bf16")  # the fp32 kernel: for bf16 only


@pytest.mark.parametrize("args, message", [(["--repeats", "0"], "--repeats must be at least 1"),
                                           (["--rows", "512", "0"], "--rows must all be at least 1")])
def test_bench_gemm_rejects_bad_sweeps_in_one_line(args, message):
    result = run_script("scripts/bench_gemm.py", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="bench.py reads real text from ../shared/data")
def test_bench_quick_prints_the_whole_table():
    result = run_script("scripts/bench.py", "--quick", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    for case in ("(a) full-length", "(b) novel sentences", "padded to the longest", "(b) IMDB reviews",
                 "(c) pretraining step", "peak RSS", "| ORT fp32 |", "fp32 MKL F.linear", "scratchbert's GEMM kernels"):
        assert case in result.stdout
    assert "CPU: " in result.stdout and ("with AMX" in result.stdout) is cpu_gemm.AMX_BF16
    assert ("fused operators: " in result.stdout) is (bench_module().onnxruntime_missing() is None)


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="bench.py reads real text from ../shared/data")
def test_bench_runs_only_the_cases_asked_for():
    result = run_script("scripts/bench.py", "--quick", "--cases", "training", "--repeats", "1", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "(c) pretraining step" in result.stdout
    for case in ("(a) full-length", "(b) novel sentences", "peak RSS", "Minor page faults"):
        assert case not in result.stdout


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="bench_fusion.py reads real text from ../shared/data")
def test_bench_fusion_prints_every_variant():
    result = run_script("scripts/bench_fusion.py", "--layers", "1", "--repeats", "1", "--no-compile", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| batch | plain | fast, unfused | fast |" in result.stdout
    assert result.stdout.count(" ms |") >= 2 and "CPU: " in result.stdout


def bench_module():
    """scripts/bench.py as a module (registered, as its dataclasses need)."""
    name = "scratchbert_bench_script"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "bench.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def test_bench_says_when_onnxruntime_is_missing(monkeypatch):
    bench = bench_module()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert bench.onnxruntime_missing() == "onnxruntime not installed (pip install -e .[bench])"
    assert bench.ort_version() == "(not installed)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_bench_gpu_without_a_gpu_says_so_in_one_line():
    done = run_script("scripts/bench_gpu.py")
    assert done.returncode == 2 and "no CUDA device" in done.stderr and "scripts/bench.py times the CPU" in done.stderr
    assert "Traceback" not in done.stderr


def test_bench_targets_say_met_or_not_met():
    bench = bench_module()
    row = bench.Row(case="(a) full-length (16, 128)", dtype="fp32", real_tokens=2048, padded_tokens=2048, ours_s=1.0,
                    theirs_s=1.5, flops=1e12, peak_kind="fp32", ort_s=0.9, targets=[("transformers", 1.0), ("ORT", 1.0)])
    assert row.target_cell() == ">= 1.00x transformers: met; >= 1.00x ORT: **not met**"
    row.ort_s, row.targets = None, [("ideal", 0.8), ("ORT", 1.3)]
    assert row.target_cell() == ">= 80% of ideal: met; >= 1.30x ORT: n/a"
    table = bench.format_table([row], {"fp32 MKL F.linear": 2e11, "bf16 oneDNN": 8e11}, threads=2)
    assert "| – | – | 1,000 ms | **1.50x** |" in table  # no ORT, no plain column in this row
    row.plain_s, row.targets = 1.05, [("plain", 1.0)]
    assert row.target_cell() == ">= 1.00x plain: met" and "| 1,050 ms | 1,000 ms |" in bench.format_table([row], {"fp32 MKL F.linear": 2e11}, 2) and "fp32 MKL F.linear 200, bf16 oneDNN 800 GFLOP/s" in table


def budget_bench_module(monkeypatch, scikit_learn: bool = True):
    """scripts/bench_pretrain_budget.py as a module; it imports scripts/labelled_sets.py as a script does.

    `scikit_learn`: whether it finds the TF-IDF row's package (the default install has none).
    """
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("scratchbert_budget_bench", REPO / "scripts" / "bench_pretrain_budget.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "have_scikit_learn", lambda: scikit_learn)
    return module


def test_budget_bench_takes_each_sets_label_budget_unless_told(monkeypatch):
    bench = budget_bench_module(monkeypatch)
    imdb, bbc = bench.parse_args([]), bench.parse_args(["--set", "bbc-news"])
    assert (imdb.train_examples, imdb.validation_examples, imdb.test_examples) == (2000, 500, 2000)
    assert (bbc.train_examples, bbc.validation_examples, bbc.test_examples) == (450, 0, 1000)
    assert (imdb.preset, imdb.vocab_size, bbc.preset, bbc.vocab_size) == ("tiny", 4096, "tiny", 4096)  # the pretrain command's defaults
    assert imdb.max_seq_length == bbc.max_seq_length == 64  # its block length too (docs/pretraining.md)
    assert bench.parse_args(["--set", "bbc-news", "--preset", "mini"]).preset == "mini"
    assert bench.parse_args(["--set", "bbc-news", "--train-examples", "400"]).train_examples == 400
    assert bench.parse_args(["--train-reviews", "300"]).train_examples == 300  # the old flag still works
    assert bbc.epochs is None and bbc.finetune_lr is None  # the command's own fine-tuning defaults
    assert imdb.rows == ["a", "b", "c", "d"] and bench.parse_args(["--rows", "a", "d", "c", "--skip", "c"]).rows == ["a", "d"]
    options = bench.parse_args(["--pretrain-option", "mask_replace_prob=1.0", "--pretrain-option", "packing=sentence-pairs"])
    assert imdb.pretrain_options == {} and options.pretrain_options == {"mask_replace_prob": 1.0, "packing": "sentence-pairs"}
    assert bench.finetune_settings(bbc) == "the command defaults"
    assert bench.finetune_settings(bench.parse_args(["--pooling", "mean", "--epochs", "3"])) == "epochs 3.0, pooling mean"


def test_bible_verses_follow_books_and_run_on_lines(monkeypatch):
    bench = budget_bench_module(monkeypatch)
    labelled_sets = sys.modules["labelled_sets"]  # scripts/labelled_sets.py, as the bench imported it
    text = "\nGenesis 1\n\n  1 In the beginning.\n  2 And the earth was without form,\nand void.\n\n1 Samuel 3\n\n  1 And the child Samuel\nministered.\n"
    assert labelled_sets.bible_verses(text) == [
        ("Genesis", "In the beginning."), ("Genesis", "And the earth was without form, and void."), ("1 Samuel", "And the child Samuel ministered."),
    ]  # fmt: skip
    kjv = labelled_sets.KJV
    if not kjv.is_file():
        pytest.skip(f"no {kjv}: the whole Bible's split is checked where ../shared/data exists")
    data = labelled_sets.kjv_testament_set()
    assert (len(data["train"]), len(data["test"])) == (29_289, 1_813)  # 31,102 verses
    labels = [row["label"] for row in data["train"] + data["test"]]
    assert (labels.count("old"), labels.count("new")) == (23_145, 7_957)  # Genesis-Malachi, Matthew-Revelation
    genres = labelled_sets.kjv_genre_set()
    assert [row["text"] for row in genres["train"]] == [row["text"] for row in data["train"]]  # one split: one pretraining text
    counts = {name: [row["label"] for row in genres["train"] + genres["test"]].count(name) for name in labelled_sets.GENRES.values()}
    assert counts == {"law": 5_852, "history": 7_018, "wisdom": 4_785, "prophets": 5_490, "gospels and acts": 4_786, "letters": 3_171}
    assert bench.parse_args(["--set", "kjv-testament"]).train_examples == bench.parse_args(["--set", "kjv-genre"]).train_examples == 400


def test_budget_bench_passes_finetune_options_and_names_their_runs(monkeypatch):
    bench = budget_bench_module(monkeypatch)
    plain = bench.parse_args([])
    assert plain.finetune_options == {} and bench.finetune_tag(plain) == ""
    assert bench.explicit_finetune_options(plain) == {}
    args = bench.parse_args(["--pooling", "mean", "--finetune-option", "truncation=head", "--finetune-option", "min_steps=600"])
    assert args.finetune_options == {"truncation": "head", "min_steps": 600}
    assert bench.explicit_finetune_options(args) == {"pooling": "mean", "truncation": "head", "min_steps": 600}
    assert bench.finetune_tag(args) == "-mean-min_steps=600-truncation=head"  # its own run folders and table
    assert bench.finetune_settings(args) == "pooling mean, min_steps 600"  # the truncation is named in the header
    assert bench.finetune_tag(bench.parse_args(["--finetune-length", "128", "--finetune-option", "truncation=head"])) == "-len128-truncation=head"
    assert "finetune_options" in bench.FINETUNE_ARGS  # a reused run made with other options is made again
    # another learning rate or number of epochs does not overwrite the default runs of the same length
    assert bench.finetune_tag(bench.parse_args(["--finetune-length", "512", "--finetune-lr", "5e-4", "--epochs", "5"])) == "-len512-lr0.0005-epochs5"
    # a label budget other than the set's: its own runs, so a learning curve leaves the default table as it is
    assert bench.finetune_tag(bench.parse_args(["--train-examples", "500"])) == "-labels500"
    assert bench.finetune_tag(bench.parse_args(["--set", "bbc-news", "--train-examples", "450"])) == ""


def test_budget_bench_label_curve_reads_each_budgets_table_and_no_other(monkeypatch, tmp_path):
    bench = budget_bench_module(monkeypatch)

    def table(name, train_examples, accuracies):
        rows = {key: {"name": f"({key}) row", "runs": [{"accuracy": value} for value in values]} for key, values in accuracies.items()}
        (tmp_path / name).write_text(json.dumps({"args": {"train_examples": train_examples}, "rows": rows}))

    table("results.json", 2000, {"a": [0.85, 0.86], "c": [0.86, 0.87]})
    table("results-labels500.json", 500, {"a": [0.82, 0.84], "b": [0.77, 0.77], "c": [0.80, 0.82]})
    table("results-labels500-len128.json", 500, {"a": [0.1, 0.1]})  # other fine-tuning settings: not this curve
    table("results-mean.json", 2000, {"a": [0.2, 0.2]})
    args = bench.parse_args(["--label-curve", "--out", str(tmp_path)])
    curves, names = bench.label_curve(tmp_path, args)
    assert curves == {"a": {500: [0.82, 0.84], 2000: [0.85, 0.86]}, "b": {500: [0.77, 0.77]}, "c": {500: [0.80, 0.82], 2000: [0.86, 0.87]}}
    assert names == {"a": "(a) row", "b": "(b) row", "c": "(c) row"}
    assert bench.label_curve(tmp_path, bench.parse_args(["--finetune-length", "128", "--out", str(tmp_path)]))[0] == {"a": {500: [0.1, 0.1]}}

    plot = bench.write_label_curve(tmp_path, args)
    assert plot == tmp_path / "label_curve.png" and plot.stat().st_size > 1000
    table_text = (tmp_path / "label_curve.md").read_text().splitlines()
    assert table_text[0] == "| model | 500 labels | 2,000 labels |"
    assert table_text[2] == "| (a) row | 0.8300 ± 0.0141 | 0.8550 ± 0.0071 |" and table_text[3] == "| (b) row | 0.7700 ± 0.0000 |  |"
    with pytest.raises(SystemExit, match="no results-cls.json or results-labelsN-cls.json"):
        bench.label_curve(tmp_path, bench.parse_args(["--pooling", "cls", "--out", str(tmp_path)]))
    (tmp_path / "results-labels250.json").write_text('{"args": {"train_examples": 2')  # a run killed while writing
    with pytest.raises(SystemExit, match="results-labels250.json is not a table this script wrote"):
        bench.label_curve(tmp_path, args)


def test_budget_bench_reuses_only_a_pretraining_run_made_as_the_table_would_say(monkeypatch, tmp_path):
    bench = budget_bench_module(monkeypatch)
    run = tmp_path / "a"
    run.mkdir()
    (run / "pretrain_config.json").write_text(json.dumps({"time_budget": 15.0, "max_seq_length": 256, "preset": "tiny", "batch_size": 32}))
    bench.check_reused_pretraining(bench.parse_args(["--set", "bbc-news", "--minutes", "15", "--max-seq-length", "256"]), run)
    with pytest.raises(SystemExit, match="pretrained with --minutes 15.0, --max-seq-length 256: give the same to reuse it"):
        bench.check_reused_pretraining(bench.parse_args(["--set", "bbc-news"]), run)  # the defaults: 60 minutes, 64 tokens


def test_budget_bench_reads_a_runs_last_final_record(monkeypatch, tmp_path):
    bench = budget_bench_module(monkeypatch)
    final = {"type": "final", "step": 40, "tokens_seen": 81_920, "training_seconds": 12.5}
    records = [{"type": "eval", "step": 20}, final | {"step": 30}, final]  # a resumed run ends twice
    (tmp_path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert bench.pretraining_stats(tmp_path) == {"steps": 40, "tokens": 81_920, "seconds": 12.5}


@pytest.mark.parametrize("option, message", [("mask_rate=1", "an option of FinetuneConfig"), ("max_length=512", "give it as --finetune-length")])
def test_budget_bench_refuses_a_finetune_option_it_cannot_pass(option, message):
    result = run_script("scripts/bench_pretrain_budget.py", "--finetune-option", option)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_budget_bench_without_scikit_learn_refuses_the_tfidf_row_before_pretraining(monkeypatch, capsys):
    # An hour of pretraining once ended in a TypeError where row (c) found no scikit-learn.
    bench = budget_bench_module(monkeypatch, scikit_learn=False)
    with pytest.raises(SystemExit):
        bench.parse_args(["--rows", "a", "c"])
    assert "needs scikit-learn: pip install -e .[bench], or leave it out with --skip c" in capsys.readouterr().err
    assert bench.parse_args(["--rows", "a", "c", "--skip", "c"]).rows == ["a"]


def test_budget_bench_pretrains_in_the_precision_a_timed_trial_finds_faster(monkeypatch, tmp_path):
    # A rule on the CPU's flags chose wrongly twice: bf16 halves pretraining speed without bf16 units
    # (Zen 3: 7,411 against 14,840 tokens/s in fp32), and costs a fifth with them but AMX hidden
    # (Intel Xeon: 31,000 against 39,500). So `auto` times a few steps of (a)'s model and batch.
    from scratchbert.training.pretraining import precision

    bench = budget_bench_module(monkeypatch)
    assert bench.parse_args([]).mixed_precision == "auto"  # decided in main(), once the tokenizer's size is known
    asked = []
    for rates, chosen in (({"no": 39_500.0, "bf16": 31_000.0}, "no"), ({"no": 30_000.0, "bf16": 45_000.0}, "bf16")):
        def trial(make_model, batch, length, masking_rate, rates=rates):
            model = make_model()
            asked.append((type(model).__name__, model.config.hidden_size, model.config.num_hidden_layers, model.config.vocab_size, batch, length, masking_rate))
            return rates

        monkeypatch.setattr(precision, "training_rates", trial)
        args = bench.parse_args(["--set", "bbc-news", "--pretrain-option", "num_hidden_layers=4", "--out", str(tmp_path)])
        assert bench.choose_mixed_precision(args, 4000) == (chosen, rates)
        args.mixed_precision, args.precision_rates = chosen, rates
        assert bench.measured_precisions(args) == f" (the faster in a timed trial: fp32 {rates['no']:,.0f}, bf16 {rates['bf16']:,.0f} tokens/s)"
    tiny = bench.PretrainConfig(preset="tiny")
    assert asked[0] == ("ScratchBertForMaskedLM", tiny.hidden_size, 4, 4000, 32, 64, 0.3)  # the run's own model, vocabulary, batch, masks
    args = bench.parse_args(["--set", "bbc-news", "--pretrain-option", "recipe=paper", "--out", str(tmp_path)])
    bench.choose_mixed_precision(args, 4000)
    assert asked[-1][0] == "ScratchBertForPreTraining"  # (a) made MLM + NSP by --pretrain-option: its heads timed

    (tmp_path / "a").mkdir()  # reused: the precision its pretraining ran in, not a new trial's
    (tmp_path / "a" / "pretrain_config.json").write_text(json.dumps({"mixed_precision": "bf16"}))
    assert bench.choose_mixed_precision(bench.parse_args(["--out", str(tmp_path), "--reuse"]), 4000) == ("bf16", None)
    assert len(asked) == 3  # no new trial for the reused run
    assert bench.parse_args(["--mixed-precision", "no"]).mixed_precision == "no"  # told: as told


def test_budget_bench_pretrain_options_win_over_its_own_settings_seed_included(monkeypatch, tmp_path):
    """`--pretrain-option seed=1` pretrains again with another seed on the same labels and test
    documents (`--seed` also draws those); an option the bench sets itself must not clash with it."""
    from scratchbert.training.pretraining import loop as pretrain_module
    from scratchbert.training.pretraining import evaluation

    bench = budget_bench_module(monkeypatch)
    pretrained = []
    monkeypatch.setattr(pretrain_module, "pretrain", pretrained.append)
    monkeypatch.setattr(evaluation, "read_log", lambda path: [{"type": "final", "step": 7, "tokens_seen": 8, "training_seconds": 9.0}])
    args = bench.parse_args(["--seed", "5", "--pretrain-option", "seed=1", "--pretrain-option", "mlm_probability=0.4", "--out", str(tmp_path)])
    assert bench.pretrain_scratchbert(args, tmp_path / "text.txt", tmp_path / "tokenizer", tmp_path / "a") == {"steps": 7, "tokens": 8, "seconds": 9.0}
    assert (pretrained[0].seed, pretrained[0].mlm_probability, pretrained[0].time_budget) == (1, 0.4, args.minutes)
    assert args.seed == 5  # the labelled subsets and test documents keep theirs


def test_budget_bench_refuses_a_pretrain_option_pretraining_does_not_have():
    result = run_script("scripts/bench_pretrain_budget.py", "--pretrain-option", "mask_rate=1")
    assert result.returncode == 2 and "--pretrain-option 'mask_rate=1': give NAME=VALUE" in result.stderr and "Traceback" not in result.stderr


def test_budget_bench_rejects_a_budget_of_nothing_in_one_line():
    result = run_script("scripts/bench_pretrain_budget.py", "--minutes", "0")
    assert result.returncode == 2 and "--minutes must be positive" in result.stderr and "Traceback" not in result.stderr


def test_budget_bench_gives_every_row_a_seeds_labels_and_keeps_validation_and_test_apart(monkeypatch, tmp_path):
    bench = budget_bench_module(monkeypatch)
    rows = {"train": [{"text": f"train {i}", "label": i % 3} for i in range(100)], "test": [{"text": f"test {i}", "label": i % 3} for i in range(40)]}
    args = bench.parse_args(["--set", "bbc-news", "--validation-examples", "10", "--test-examples", "30"])
    data = bench.labelled_data(rows, tmp_path, args)
    validation = data["validation"].read_text().splitlines()
    assert len(data["pool"]) == 90 and len(validation) == 10 and len(data["test_rows"]) == 30
    assert not {row["text"] for row in data["pool"]} & {row["text"] for row in map(json.loads, validation)}
    first, again, other = (bench.seed_labels(data, 20, seed) for seed in (0, 0, 1))
    assert first == again and first != other and len(first) == 20  # the same labels in every row, another set per seed
    no_validation = bench.labelled_data(rows, tmp_path, bench.parse_args(["--set", "bbc-news"]))
    assert no_validation["validation"] is None and len(no_validation["pool"]) == 100


def test_budget_bench_fine_tunes_again_when_the_commands_defaults_changed(monkeypatch, tmp_path):
    """A run made before a `finetune` default changed is not reused under the same table name."""
    from scratchbert.training.finetuning import config, run

    bench = budget_bench_module(monkeypatch)
    calls = []

    def fake_finetune(checkpoint, output_dir, **options):
        calls.append(options)
        return {
            "test": {"accuracy": 0.5, "macro_f1": 0.4}, "collapsed": None, "schedule": {"learning_rate": 1e-3},
            "early_stopping": {"optimizer_steps_run": 300}, "pooling": "mean",
        }  # fmt: skip

    monkeypatch.setattr(run, "finetune_text_classification", fake_finetune)
    model = tmp_path / "a"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"")
    os.utime(model / "model.safetensors", (0, 0))  # saved long before any fine-tuning record
    data = {"pool": [{"text": f"text {i}", "label": i % 2} for i in range(10)], "validation": None, "test": tmp_path / "test.jsonl"}
    args = bench.parse_args(["--set", "bbc-news", "--reuse"])
    out = tmp_path / "finetune-a-0"
    first = bench.finetune_scores(args, model, data, 0, out)
    assert bench.finetune_scores(args, model, data, 0, out) == first and len(calls) == 1  # same settings, same defaults: reused
    monkeypatch.setattr(config, "DEFAULT_WINDOWS", config.DEFAULT_WINDOWS + 1)
    bench.finetune_scores(args, model, data, 0, out)
    assert len(calls) == 2  # another default: fine-tuned again


# ---------------------------------------------------------------------------------------------
# scripts/cpu_standin.sh: CI's stand-ins for the CPU kinds this machine is not
# ---------------------------------------------------------------------------------------------

ZEN3_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi2"
ZEN4_FLAGS = ZEN3_FLAGS + " avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16"


def run_standin(kind: str, flags: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """cpu_standin.sh KIND on a CPU with these flags (a fake /proc/cpuinfo), running a command that prints its ATen cap."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    command = ["bash", "scripts/cpu_standin.sh", kind, "bash", "-c", 'echo "ran with $ATEN_CPU_CAPABILITY"']
    env = {"PATH": "/usr/bin:/bin", "CPU_STANDIN_CPUINFO": str(cpuinfo)}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("kind, flags", [("avx2", ZEN3_FLAGS), ("avx2", ZEN4_FLAGS), ("avx512", ZEN4_FLAGS)])
def test_cpu_standin_holds_a_cpu_to_an_older_kind(kind, flags, tmp_path):
    result = run_standin(kind, flags, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"ran with {kind}"


@pytest.mark.parametrize("kind, flags, missing", [("avx512", ZEN3_FLAGS, "avx512f"), ("avx2", "fpu sse sse2 avx", "avx2"), ("avx2", "", "avx2")])
def test_cpu_standin_refuses_a_kind_newer_than_the_cpu_before_running_anything(kind, flags, missing, tmp_path):
    # ATen would run AVX-512 kernels on a Zen 3 and die of SIGILL: CI skips such a kind on exit status 77.
    result = run_standin(kind, flags, tmp_path)
    assert result.returncode == 77
    assert result.stdout == ""
    assert f"this CPU has no {missing}" in result.stderr


def test_cpu_standin_names_the_kinds_it_knows(tmp_path):
    result = run_standin("avx10", ZEN4_FLAGS, tmp_path)
    assert result.returncode == 2 and "use avx2 or avx512" in result.stderr


def test_the_tuned_tfidf_baseline_chooses_by_cross_validation_on_the_labels_alone(monkeypatch):
    # The fixed row (C = 10, no class weights) was 6 macro-F1 points under the tuned one on a 74/26 set.
    pytest.importorskip("sklearn", reason="scikit-learn comes with the bench extra (pip install -e .[bench]), not the test one")
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from labelled_sets import TFIDF_GRID, tfidf_scores

    words = {"a": "river boat water fish", "b": "desert sand sun camel"}
    rows = lambda label, n, noise: [{"text": f"{words[label]} {noise} {i}", "label": label} for i in range(n)]  # noqa: E731
    train = rows("a", 40, "plain") + rows("b", 12, "plain")
    test = rows("a", 10, "other") + rows("b", 10, "other")
    fixed, tuned = tfidf_scores(train, test), tfidf_scores(train, test, tuned=True)
    assert fixed["accuracy"] == 1.0 and "C" not in fixed
    assert tuned["accuracy"] == 1.0 and tuned["macro_f1"] == 1.0
    assert tuned["C"] in TFIDF_GRID["logisticregression__C"] and tuned["class_weight"] in TFIDF_GRID["logisticregression__class_weight"]
