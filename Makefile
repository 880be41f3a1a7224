# crossrl: `make demo` runs the demo scenario on the embedded defaults; `make test` runs lint and tests.
# Both install what is missing first (a venv in .venv with the pinned set).

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/pip
STAMP   := $(VENV)/.stamp-install
PYTEST_FLAGS ?=
K ?=

.PHONY: install demo test test-alone test-main test-system test-cluster test-fast lint learning-tests ab-gate ab-power chromium ui clean

install: $(STAMP)

# torch first, from its pinned CPU wheel; every later pip call passes constraints.txt, which pins it,
# so nothing can pull a CUDA build of several GB. pip compiles every installed module to bytecode on one
# core (75 of the install's 126 s here); compileall does it on all cores instead (44 s on 2). Its exit
# status is not checked: some packages ship files that are not Python 3 (test data), as pip ignores too.
# setuptools says once per editable install that folders named like the package may shadow it: information
# only (crossrl is the repository root itself), so that one message is filtered out. pip prints errors only
# (-qq): a machine whose pip configuration names an extra index that lacks a package gets one warning per
# package otherwise ("Location ... is ignored"), about that configuration, not about crossrl; `pip check`
# below still checks the installed set. PIP_QUIET=-q shows pip's warnings again.
PIP_QUIET ?= -qq
$(STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install $(PIP_QUIET) --upgrade pip
	$(PIP) install $(PIP_QUIET) --no-compile torch==2.13.0
	$(PIP) install $(PIP_QUIET) --no-compile -c constraints.txt -r requirements.txt
	PYTHONWARNINGS="ignore:Editable installation" $(PIP) install $(PIP_QUIET) -c constraints.txt --no-deps -e .
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null 2>&1 || true
	$(PIP) check
	touch $(STAMP)

# Headless Chromium for the report's browser test (Debian packages).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "chromium is missing: sudo apt-get install chromium chromium-driver (the browser test will be skipped)"; fi; }

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --no-error-summary . || { echo "mypy found type errors"; exit 1; }

# The smoke scenario and `crossrl regress` against reports/baselines/smoke.json run inside the tests
# (tests/integration/test_contract.py, marked `alone`: its throughput is compared with a stored baseline,
# so it runs first with nothing beside it); the other tests run two at a time in two processes that
# take work from each other (most of a test's time is spent waiting on Ray, MLflow servers and child
# processes). The regression table is printed at the end.
test: install chromium lint test-alone test-main
	@if [ -f crossrl-results/ci/regress.md ]; then cat crossrl-results/ci/regress.md; fi

test-alone: install
	rm -f crossrl-results/ci/regress.md
	$(BIN)/pytest -m "alone" --timeout 900 --durations=3 $(PYTEST_FLAGS)

test-main: install chromium
	$(BIN)/pytest -m "not learning and not cluster and not alone and not system" -n 2 --dist worksteal --timeout 900 --durations=25 $(PYTEST_FLAGS)

# Whole built-in scenarios on every engine, a few minutes each (pixels, many agents, MuJoCo SAC, reward
# clipping, the table, a broken env on every engine, ASHA and PBT searches end to end, the A/B gate's and
# `crossrl fidelity`'s paired runs) and the long fault checks (kill and resume on every engine,
# tracking-server outages, time budgets): run by CI after `make test`, two at a time.
test-system: install
	$(BIN)/pytest -m "system and not cluster" -n 2 --dist worksteal --timeout 900 --durations=10 $(PYTEST_FLAGS)

# Tests that start Ray clusters of their own with `ray start` (a head, and a second node on loopback):
# `crossrl run --ray-address` on an existing cluster, and sweeps fanned out over two nodes.
test-cluster: install
	$(BIN)/pytest -m cluster --timeout 900 --durations=5 $(PYTEST_FLAGS)

test-fast: install
	$(BIN)/pytest -m "not learning and not integration and not cluster" $(PYTEST_FLAGS)

# Full learning runs (long: about an hour on 2 cores). tests/learning goes through the real runner and
# writes crossrl-results/learning/table.md (docs/learning.md's table); tests/core checks the core in-process.
# K selects cases by pytest -k expression: make learning-tests K="crossrl and (ppo or a2c or dqn)"
learning-tests: install
	$(BIN)/pytest -m learning -s --timeout 7200 tests/learning tests/core $(if $(K),-k "$(K)") $(PYTEST_FLAGS)

# The paired A/B gate: BASE (a git revision with the same pinned requirements) and this work tree measured
# alternately on this machine; exit 1 on a regression. AB_FLAGS: more `crossrl ab` options.
BASE ?= origin/main
AB_FLAGS ?=
ab-gate: install
	$(BIN)/crossrl ab $(BASE) $(AB_FLAGS) --markdown crossrl-results/ci/ab.md --junit crossrl-results/ci/ab.xml

# The gate's power on this machine: RUNS gate runs with a planted slowdown of PLANT, RUNS on identical code.
RUNS ?= 10
PLANT ?= 0.05
ab-power: install
	$(BIN)/python tests/bench/ab_power.py --runs $(RUNS) --plant $(PLANT) --out crossrl-results/ab-power

demo: install
	$(BIN)/crossrl run demo --skip-unsupported; status=$$?; \
	echo; echo "results store: crossrl-results/ (sqlite + artifacts); browse it with: $(BIN)/crossrl ui"; \
	exit $$status

ui: install
	$(BIN)/crossrl ui

clean:
	rm -rf crossrl-results .pytest_cache .mypy_cache .ruff_cache build *.egg-info
