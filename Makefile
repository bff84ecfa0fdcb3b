# Two commands on a fresh clone: `make demo` and `make test`. Each creates .venv and installs
# the project with its pinned constraints (torch==2.13.0, the CPU build) before it runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[train,server,data,dev,ray]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/edgetrain demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

# Benchmarks (not tests): numbers go to bench/results/ and, by hand, to BENCHMARKS.md.
bench: $(STAMP)
	$(PY) bench/transport.py
	$(PY) bench/overhead.py
	$(PY) bench/memory_ratio.py

clean:
	rm -rf $(VENV) runs build *.egg-info
