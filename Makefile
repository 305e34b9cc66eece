# `make demo` and `make test` do all set-up themselves (scripts/setup.sh is idempotent).
PY := .venv/bin/python

.PHONY: setup demo test bench
setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m corten.demo

test: setup
	$(PY) -m pytest -p no:cacheprovider --durations=30 tests

bench: setup
	$(PY) benchmarks/bench_reference_mv2.py
