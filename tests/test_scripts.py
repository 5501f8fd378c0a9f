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


def test_bench_gemm_sweeps_and_names_this_cpus_choice():
    result = run_script("scripts/bench_gemm.py", "--start", "1024", "--stop", "1024", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    header, _, _, row = result.stdout.strip().splitlines()
    assert ("this CPU has AMX" in header) is cpu_gemm.AMX_BF16
    cells = row.strip("|").split("|")
    assert cells[0].strip() == "1024" and len(cells) == 5
    assert "*" in cells[2] and "*" in cells[4] and "*" not in cells[1]  # the two 768-output shapes are split
    # Where the model runs bf16 on fp32 kernels, every shape shows that path too (+).
    assert all(("+" in cell) is not cpu_gemm.BF16_UNITS for cell in cells[1:])


@pytest.mark.parametrize("args, message", [(["--start", "0"], "--start must be at least 1"),
                                           (["--start", "512", "--stop", "256"], "must not be below --start")])
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
