# pgnb: two commands on a fresh machine -- `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
# A CPU build of torch; override e.g. `make test TORCH_SPEC="torch==2.14.1"` (or TORCH_SPEC= to keep yours).
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# A user's install (`pip install .`, no extras) plus only nbval and pytest to drive it, and the training
# libraries lesson 15 names (notebooks/requirements.txt): `make test` replays the notebooks and runs a traced cell there
# (tests/test_user_install.py, tests/test_notebooks.py).
USER_VENV ?= .venv-user
USER_PY := $(USER_VENV)/bin/python
USER_PIP := $(USER_PY) -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=
# As root, `make test` installs Chromium, so the browser test must run rather than skip.
PGNB_REQUIRE_BROWSER ?= $(shell [ "$$(id -u)" = 0 ] && echo 1)
export PGNB_REQUIRE_BROWSER
# Likewise the user-install check fails rather than skips as root when PGNB_USER_PYTHON is not given.
PGNB_REQUIRE_USER_INSTALL ?= $(shell [ "$$(id -u)" = 0 ] && echo 1)
export PGNB_REQUIRE_USER_INSTALL
# Likewise the Slurm tests (tests/test_slurm.py start a single-node cluster of their own from the Debian packages).
PGNB_REQUIRE_SLURM ?= $(shell [ "$$(id -u)" = 0 ] && echo 1)
export PGNB_REQUIRE_SLURM
# And the SSH launcher's test (tests/test_ssh.py: sshd in network namespaces) when sshd is missing.
PGNB_REQUIRE_SSH ?= $(shell [ "$$(id -u)" = 0 ] && echo 1)
export PGNB_REQUIRE_SSH
# Debian packages the tests use (browser test, MPI launcher, network namespaces, SSH launcher, a Slurm cluster).
APT_PACKAGES := chromium openmpi-bin libopenmpi-dev iproute2 openssh-server openssh-client slurm-wlm munge

.PHONY: demo test venv test-venv user-venv system-deps bench soak reliability lint clean matrix matrix-venvs

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

venv: $(PY)
	@if [ -n "$(TORCH_SPEC)" ]; then $(PIP) install "$(TORCH_SPEC)"; fi
	$(PIP) install -e .

demo: venv
	$(VENV)/bin/pgnb demo

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "warning: missing Debian packages:$$missing (their tests will skip)"; fi; \
	fi

test-venv: venv system-deps
	$(PIP) install -e ".[test,browser]"
	@if dpkg -s libopenmpi-dev >/dev/null 2>&1; then $(PIP) install "mpi4py>=3.1"; fi

$(USER_PY):
	$(PYTHON) -m venv $(USER_VENV)
	$(USER_PIP) install --upgrade pip

# torch first: a bare torch requirement would pull a CUDA build; pgnb's own requirements come from
# installing pgnb's wheel alone, built anew into dist/ every time (the file users get: tests/test_package.py
# checks its contents and metadata), so the check sees the current tree.
user-venv: $(USER_PY)
	@if [ -n "$(TORCH_SPEC)" ]; then $(USER_PIP) install "$(TORCH_SPEC)"; fi
	rm -f dist/pgnb-*.whl
	$(USER_PIP) wheel --no-deps -w dist .
	$(USER_PIP) install dist/pgnb-*.whl
	$(USER_PIP) install nbval pytest -r notebooks/requirements.txt
	$(USER_PIP) install --force-reinstall --no-deps dist/pgnb-*.whl

# pytest in one stage; its exit status 5 (no test selected, e.g. PYTEST_ARGS picked another stage's file) is not a failure
STAGE = PGNB_USER_PYTHON=$(abspath $(USER_PY)) $(PY) -m pytest -x $(PYTEST_ARGS)
NO_TESTS_OK = || [ $$? = 5 ]

# Two pytest-xdist workers, a test module each at a time (module fixtures stay shared): the engine, kernel,
# notebook and browser tests mostly wait (rendezvous, timeouts, a kernel's round trips), so two at once
# nearly halve the wall time on 2 cores. PARALLEL= runs them one by one.
PARALLEL ?= -n 2 --dist loadfile

# In stages, fast first; the first failure stops the run, and its report is the last thing pytest prints.
# 1. no engines (unit: spec, views, parsing, layout)  2. real engines and kernels  3. notebooks and the browser
test: test-venv
	$(STAGE) -m "not integration and not browser" $(NO_TESTS_OK)
	$(MAKE) --no-print-directory user-venv
	$(STAGE) $(PARALLEL) -m "integration and not notebooks and not browser" $(NO_TESTS_OK)
	$(STAGE) $(PARALLEL) -m "notebooks or browser" $(NO_TESTS_OK)

# The support matrix (docs/supported_versions.md): pgnb's oldest and newest allowed versions, Python 3.10-3.13, a venv each
# (.venv-matrix-*), each running a quick part of the suite; the columns and tests are in tests/support_matrix.py.
# Only the standard library runs it, so CI builds the venvs in the background while lint and make test run.
matrix:
	$(PYTHON) tests/support_matrix.py --jobs 2 --workers 1

matrix-venvs:
	$(PYTHON) tests/support_matrix.py --install-only

# the slow set, then every notebook replayed twice in a row (make test replays most of them once); tests/conftest.py
# gives each run its own IPYTHONDIR and temporary folder
soak: test-venv user-venv
	$(PY) -m pytest -m slow --run-slow tests/test_soak.py tests/test_reliability.py tests/test_busy.py tests/test_chaos.py tests/test_trace_under_load.py tests/test_slurm.py tests/test_torch_suites.py
	PGNB_USER_PYTHON=$(abspath $(USER_PY)) $(PY) -m pytest -m notebooks --run-slow tests/test_notebooks.py

# docs/reliability.md's table, from a run of the reliability and soak tests
reliability: test-venv
	$(PY) tests/reliability_table.py --run-slow tests/test_reliability.py tests/test_soak.py tests/test_chaos.py

# docs/performance.md's table, from a full run
bench: test-venv
	IPYTHONDIR=$$(mktemp -d) $(PY) -m benchmarks

# ruff, mypy --strict, and the import directions (tests/test_layout.py, no engines). Only the dev extras:
# no Chromium, no OpenMPI, no test extras, so CI reports a lint error within two minutes.
lint: venv
	$(PIP) install -e ".[dev]"
	$(PY) -m ruff check pgnb tests benchmarks
	$(PY) -m mypy --strict pgnb
	$(PY) -m pytest -q -p no:cacheprovider -m "not integration" tests/test_layout.py

clean:
	rm -rf $(VENV) $(USER_VENV) .venv-matrix-* .pytest_cache
