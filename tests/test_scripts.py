"""The benchmark scripts run, validate their arguments, and report which CPU choices they measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
        assert (timings[2] != "–") is (cpu_gemm.ONEDNN and product == "forward, inference")  # prepacked: inference only
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
    for case in ("(a) full-length", "(b) novel sentences", "(b) IMDB reviews", "(c) pretraining step", "peak RSS"):
        assert case in result.stdout
    assert "CPU: " in result.stdout and ("with AMX" in result.stdout) is cpu_gemm.AMX_BF16
