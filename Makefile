# Two commands on a fresh clone: `make demo` and `make test`. Each creates .venv and installs
# the project with its pinned constraints (torch==2.13.0, the CPU build) before it runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# npm script of edge_sdk_js/ that test-js runs: `test` (quick), `test:slow` (fleets, resume, serve --web),
# `test:heavy` (the WebGPU conformance on SwiftShader, the accuracy comparisons)
JS_TESTS ?= test

.PHONY: demo test test-slow test-heavy test-all test-js install bench clean

# --no-compile: pip byte-compiles every module of every package it installs (torch's thousands: about 45 s
# of CPU on 2 cores); Python compiles the ones a run imports, once, on first import.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -c constraints.txt -e '.[train,server,data,dev,ray,secure]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/edgetrain demo

# `make test` is the suite a change must pass; its target is 10 minutes on 2 cores from a fresh clone,
# install included (588 s on 2026-12-06: the install 64 s, the Python tier 448 s, the JavaScript
# 81 s). The long end-to-end tests (whole fleets of device processes, attack runs, many rounds)
# carry @pytest.mark.slow and run in `make test-slow`; CI (.ci/run) runs both tiers, `make test-all` does the same here.
# --dist loadgroup: a module marked xdist_group (the attack fleets) runs on one worker, its shared
# fleets once.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow" $(PYTEST_ARGS)
	$(MAKE) test-js

test-slow: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "slow and not heavy" $(PYTEST_ARGS)
	$(MAKE) test-js JS_TESTS=test:slow

# The heavy tier: runs whose cost is minutes of CPU each and whose claim is a measured margin (an
# attacker's cost in accuracy over two live fleets of eight rounds, every split of the phone-sized
# transformer exported and verified, ResNet20's deep tails (2-6) and char_transformer's tails beyond
# its whole model, the WebGPU tab's numbers on SwiftShader, the mixed and the secure mixed fleets'
# accuracy against a second fleet's), or that
# repeat what a fleet in CI holds (the status page's login over plain http; CI logs in over https).
# Not in CI, whose hour the two tiers above fill (CI keeps one fleet of each kind); run before a
# release and after changing what they cover.
test-heavy: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m heavy $(PYTEST_ARGS)
	$(MAKE) test-js JS_TESTS=test:heavy

test-all: test test-slow test-heavy

# The JavaScript device SDK (edge_sdk_js/, docs/js-device.md): dependencies from its lockfile,
# a strict type-check and build, then its tests against this checkout's Python (conformance with
# the Python device, a mixed fleet end to end, and, where chromium is installed, a browser tab).
# ONNXRUNTIME_NODE_INSTALL=skip: onnxruntime-node's install script would fetch a GPU provider.
# EDGETRAIN_TRAIN_GRAPH_CACHE: the Python device's reference cases read the training graphs the Python
# tests exported and verified (pytest's cache), instead of exporting them again (tens of seconds each).
test-js: $(STAMP)
	@command -v npm >/dev/null || { echo "npm not found: the JavaScript SDK's tests need Node.js >= 20 (https://nodejs.org)"; exit 1; }
	cd edge_sdk_js && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error
	cd edge_sdk_js && EDGETRAIN_PYTHON=$(abspath $(PY)) \
		EDGETRAIN_TRAIN_GRAPH_CACHE=$${EDGETRAIN_TRAIN_GRAPH_CACHE:-$(abspath .pytest_cache/d/edgetrain-train-graphs)} \
		npm run $(JS_TESTS)

# Benchmarks (not tests): numbers go to bench/results/ and, by hand, to BENCHMARKS.md.
bench: $(STAMP)
	$(PY) bench/transport.py
	$(PY) bench/overhead.py
	$(PY) bench/memory_ratio.py

clean:
	rm -rf $(VENV) runs build *.egg-info
