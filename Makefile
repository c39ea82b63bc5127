# Every target does its own set-up: a fresh machine needs only python3 and make.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the site's build (``docs``; ``test`` runs it beside the suite without a sub-make, which
# ``make -n`` would run)
SPHINX = $(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
# no network here: Prefect's telemetry would only print errors
export PREFECT_SERVER_ANALYTICS_ENABLED := false
# the numba cache `import pipeline` picks (``pipeline.numba_cache_dir``; each kernel in it stamped
# with the kernel sources it can hold, ``kernels._cache``), so that make's targets, the set-up's
# `dpmm warm` and the user's own programs share one
export NUMBA_CACHE_DIR := $(shell PYTHONPATH=. $(PY) -c 'import os, pipeline; print(os.environ.get("NUMBA_CACHE_DIR", ""))')

.PHONY: install lock run test docs wheel bench bench-gpu faults lint typecheck format clean

# requirements.lock pins every package (the image installs with the same constraints); the kernels
# of a first fit, `dpmm run` and `dpmm demo` are compiled then (`dpmm warm`), not at their first use.
# uv installs the same pins as pip in under a third of the time (38 s against 129 s from an empty
# cache, docs/performance.md); pip does it where uv cannot be had. Both compile the packages'
# bytecode as they install (uv only when asked): where PYTHONDONTWRITEBYTECODE is set, as on
# these machines, nothing else ever does, and every process would compile its imports again
$(STAMP): pyproject.toml requirements.lock
	$(PY) -m venv $(VENV)
	{ $(BIN)/pip install -q -c requirements.lock uv && $(BIN)/uv pip install -q \
	  --compile-bytecode --python $(BIN)/python -c requirements.lock -e '.[dev]'; } \
	|| $(BIN)/pip install -q -c requirements.lock -e '.[dev]'
	$(BIN)/dpmm warm
	touch $(STAMP)

install: $(STAMP)

# after a change of pyproject.toml's dependencies: install them, then pin what is installed
lock:
	$(BIN)/pip install -q -e '.[dev]'
	{ sed -n '1,3p' requirements.lock; $(BIN)/pip freeze --exclude-editable; } > requirements.lock.new
	mv requirements.lock.new requirements.lock

run: $(STAMP)
	$(BIN)/dpmm demo --out out/demo

# the suite tests the kernels as compiled at first use, never those a `make wheel` left to ship
test: export DPMM_SHIPPED_KERNELS = 0
# NumPy's BLAS on one thread in every process of the suite, as on Dask's workers: three test
# processes share two cores, and each one's pool of BLAS threads only spun beside its small
# matrices (the estimators', models', families' and kernels' tests 61 -> 54 s, 116 -> 98 s of CPU)
test: export OPENBLAS_NUM_THREADS = 1
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache --no-logo
	# the suite starts hundreds of Python processes (commands, workers): each would compile the
	# project's modules again where PYTHONDONTWRITEBYTECODE is set (0.2 s each)
	$(BIN)/python -m compileall -q -j 0 pipeline flows kernels tests
	# each family's and model's kernels compiled once, a process per core, before the test
	# processes start: each compiled them itself before, at once (tests/warm.py)
	$(BIN)/python -m tests.warm
	# three test processes on two cores: the end-to-end tests spend much of their time waiting
	# (a SLURM walltime, a cron's minute, servers starting), which a third process fills (the
	# suite 1,067 s -> 798 s on one machine, with the S3 fix of the same day; the slowest modules
	# start first, tests/conftest.py). The 40 slowest tests are listed at the end. mypy, and the
	# site with its tests (``docs``), run alongside: the suite leaves about a tenth of the two
	# cores idle, which they fill (in a working checkout the suite 651 s, then the site 61 s;
	# the two together 638 s; from a fresh clone, whose site builds from nothing, no measurable
	# change: docs/performance.md). Their output follows the suite's; any of the three failing
	# fails the target once all are done
	@mkdir -p out/make-test
	$(BIN)/mypy > out/make-test/mypy.log 2>&1 & typed=$$!; \
	{ $(SPHINX) && $(BIN)/pytest -q -p no:cacheprovider tests/docs; } \
		> out/make-test/site.log 2>&1 & site=$$!; \
	$(BIN)/pytest -q -n 3 --dist worksteal --durations=40 --ignore=tests/docs; suite=$$?; \
	wait $$typed; typed=$$?; wait $$site; site=$$?; \
	cat out/make-test/mypy.log out/make-test/site.log; \
	exit $$(( suite || typed || site ))

# the site (docs/_build/html): Sphinx with warnings as errors; its tutorials run as it builds,
# on the numba cache that `dpmm warm` and tests.warm compiled (make test builds it alongside
# the suite)
docs: $(STAMP)
	$(SPHINX)

# a wheel (dist/) for machines that should not compile the kernels themselves (a cluster's
# workers, a user's pip install): it ships them compiled for any CPU of this architecture
# (`dpmm warm --portable` into kernels/_compiled), and its installs load them at first use
wheel: $(STAMP)
	$(BIN)/dpmm warm --portable
	$(BIN)/uv build -q --wheel --out-dir dist .

bench: $(STAMP)
	$(BIN)/pytest -q -m bench tests/benchmarks -s -p no:cacheprovider

# the fault tests (tests/flows/test_faults.py, marked faults) and the fault campaign
# (docs/how-to/faults.md), not part of make test: RUNS runs of the commands,
# each with a fault drawn at random (seeded by SEED); the table goes to out/faults.json and .md.
# Exit status 1 if any run ended otherwise than equal to the undisturbed run or with one clear
# error line. About a minute a run on a quiet 2-core machine.
RUNS ?= 200
SEED ?= 0
faults: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -m faults tests/flows/test_faults.py
	$(BIN)/python -m tests.campaign --runs $(RUNS) --seed $(SEED) --out out/faults

# on a machine with an NVIDIA GPU and the GPU extra already installed ('.[gpu]'); installs
# nothing (no $(STAMP): such a machine may have no network). Under 8 minutes.
BENCH_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
bench-gpu:
	$(BENCH_PY) -m pytest -q -m bench tests/benchmarks/bench_gpu.py -s -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache --no-logo

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache docs/_build docs/auto_tutorials \
		dist kernels/_compiled
