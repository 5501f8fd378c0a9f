# The two fresh-machine commands of the README:
#   make demo   pretrain a tiny BERT on the embedded corpus, then show what it learned
#   make test   run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-slow
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

# --resume: a second `make demo` continues an interrupted run in runs/tiny, or shows a finished one again.
demo: setup
	$(VENV)/bin/scratchbert pretrain --resume

test: setup
	$(PY) -m pytest

test-slow: setup
	$(PY) -m pytest -m slow
