# `make demo` and `make test` do all set-up themselves (scripts/setup.sh is idempotent).
PY := .venv/bin/python

.PHONY: setup demo test bench
setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m corten.demo

# Two workers (pytest-xdist; the machine has 2 cores; an idle worker takes queued tests from the busy one), tests in a random order (pytest-randomly:
# the seed is printed at the end, `--randomly-seed=N` repeats an order).
test: setup
	$(PY) -m pytest -p no:cacheprovider -n 2 --dist worksteal --durations=30 tests

bench: setup
	$(PY) benchmarks/bench_reference_mv2.py
