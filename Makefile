# Each target does its own set-up: a .venv with the CPU build of torch installed first (pinned, so pip
# never pulls a multi-GB CUDA build), then this package with its extras, every package at the exact
# version in constraints.txt.
PY := .venv/bin/python
PROFILE ?= cpu

.PHONY: setup reproduce test test-all lab lint clean-reports

.venv/.installed: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv .venv
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0 -c constraints.txt
	$(PY) -m pip install -q -e ".[test,notebooks,gpu,eval,sweep]" -c constraints.txt
	$(PY) -m ipykernel install --sys-prefix --name studylib --display-name "studylib (.venv)" >/dev/null
	touch $@

setup: .venv/.installed

reproduce: setup
	.venv/bin/studylib reproduce --profile $(PROFILE)

# Two pytest workers (the machine class has two cores); each test, a chapter notebook included, goes to
# whichever worker is free. (--dist loadfile would keep the notebooks in one worker, one after another, but
# their serial time is longer than the whole suite's; xdist's loadgroup grouping has no effect with pytest 9.)
test: setup
	$(PY) -m ruff check studylib tests benchmarks
	$(PY) -m pytest -q -m "not gpu" -n 2

lab: setup
	.venv/bin/jupyter lab --notebook-dir=notebooks

lint: setup
	$(PY) -m ruff check studylib tests benchmarks
