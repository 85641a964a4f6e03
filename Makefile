# fedlnl — two commands on a fresh machine: `make run` (install + quickstart sweep), `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Torch builds that lie on this project's machines' disks (x86_64: CUDA build, runs on CPU too).
ifeq ($(shell uname -m),aarch64)
TORCH  ?= torch==2.9.1 torchvision==0.24.1
else
TORCH  ?= torch==2.14.1 torchvision==0.29.1
endif
PYTEST_ARGS ?= -q -n 2

.PHONY: install run test test-slow test-slurm bench bench-gpu clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test,launchers,tune]'
	touch $(STAMP)

# The quickstart: every method x noise {(0,0), (0.6,0.5)} x 2 seeds on the offline digits dataset,
# then the report. Re-running skips the cells already complete.
run: $(STAMP)
	@start=$$(date +%s); \
	$(VENV)/bin/fedlnl-run -m experiment=quickstart && \
	$(VENV)/bin/fedlnl-report results/sweeps/quickstart && \
	echo "make run: the quickstart and its report took $$(( $$(date +%s) - start )) s; open results/sweeps/quickstart/report/report.html"

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# `make bench`: one client epoch (speed.py), host reads / device moves / aten ops per local step of every
# method (steps.py), memory formats (formats.py), the FedCorr workload's first
# 10 rounds (workload.py, needs ../shared); `make bench FULL=1`: the whole workload (102 rounds, ~10 min)
BENCH_ROUNDS ?= 10

# Sweeps through a throw-away single-node SLURM cluster (tests/slurm/cluster.py: as root, installs
# slurm, munge and mariadb with apt-get when missing; stops its daemons whatever the tests do).
# Where the cluster cannot start it prints one "test-slurm: skipped: <why>" line and succeeds.
# The long multi-process checks (pytest -m slow: joblib sweeps stopped by signals, the presets' golden
# fixture, ablation rows, a 10-method quickstart): CI runs them after `make test`.
test-slow: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) -m slow

test-slurm: $(STAMP)
	$(PY) tests/slurm/cluster.py -- $(PY) -m pytest -q -s -p no:xdist -m slurm tests/slurm

bench: $(STAMP)
	$(PY) benchmarks/speed.py --threads 1
	$(PY) benchmarks/steps.py
	$(PY) benchmarks/formats.py --models lenet cnn
	$(PY) benchmarks/workload.py --rounds $(if $(FULL),0,$(BENCH_ROUNDS))

# `make bench-gpu`: every method on the CUDA device for LeNet-5 and ResNet-18 (images/s, host syncs per
# step, peak device memory); one line and success on a machine without CUDA
bench-gpu: $(STAMP)
	$(PY) benchmarks/bench_gpu.py

clean:
	rm -rf results/runs results/multirun results/sweeps
