# Two commands do all set-up on a fresh machine: `make demo` and `make test` (see README).
PY := .venv/bin/python
VENV_STAMP := .venv/.installed-v1
FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
PYTEST_ARGS ?=

.PHONY: venv demo study study-beta study-views test lint format bench test-slurm clean-venv gpu-wheels gpu-check

$(VENV_STAMP): setup.py tools/install_detectron2.py
	test -x $(PY) || python3 -m venv .venv
	@# torch's CUDA build and its libraries take ~6 GiB: warn before pip fails half-way.
	@free_mib=$$(df -Pm .venv | awk 'NR == 2 {print $$4}'); \
	if [ "$$free_mib" -lt 8192 ]; then \
		echo "WARNING: $$free_mib MiB free under $$(pwd)/.venv; the install needs about 8 GiB."; \
	fi
	$(PY) -m pip install -q --upgrade pip "setuptools<81" wheel
	# torch/torchvision first, pinned: these two versions come from local files in under a minute.
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) tools/install_detectron2.py
	$(PY) -m pip install -q -e ".[dev]"
	touch $(VENV_STAMP)

# A .venv copied or linked from another checkout imports that checkout's code (the editable
# install points there; tools/*.py then fail or run stale code): point it here again.
venv: $(VENV_STAMP)
	@$(PY) -I -c "import importlib.util as u, os, sys; s = u.find_spec('pretrain'); \
	sys.exit(not s or os.path.realpath(os.path.dirname(os.path.dirname(s.origin))) != \
	os.path.realpath('.'))" || { echo "re-pointing .venv's editable install at $$(pwd)"; \
	$(PY) -m pip install -q --no-deps -e .; }

$(FASHION_MNIST):
	@command -v apt-get >/dev/null || { echo "Fashion-MNIST missing: install Debian's dataset-fashion-mnist"; exit 1; }
	(apt-get install -y -q dataset-fashion-mnist || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist)) >/dev/null

demo: venv $(FASHION_MNIST)
	$(PY) tools/demo.py --output-dir output/demo

# LORAC vs MoCo-M vs MoCo-v2 at demo scale, 5 seeds each (15 runs; the report pairs LORAC and
# MoCo-M by seed with a 95 % interval). Measured: 84.4 min on 2 cores with STUDY_JOBS=3
# (2026-11-25). Writes docs/results.md and .png; each run's record goes to docs/results_runs/.
# STUDY_JOBS at once, one process and nproc/STUDY_JOBS threads each (a ResNet-18 at 24 px gains
# little from a second thread). Ctrl-C saves the runs in progress; `make study` again resumes
# where it stopped.
STUDY_JOBS ?= 3
study: venv $(FASHION_MNIST)
	$(PY) tools/study.py --output-dir output/study --results docs/results.md --jobs $(STUDY_JOBS) \
		--records docs/results_runs/study

# The paper's two ablations at demo scale, 3 seeds each, 2 epochs per run (beta = inf for the
# first epoch, as the paper's first half), with the demo's data and recipe. Each finished run's
# results are also kept in docs/results_runs/<sweep>/ (committed), so a sweep stopped half-way,
# even on another machine, goes on where it stopped. Measured on 2 cores with STUDY_JOBS=3:
# study-beta 18 runs, 59 min (2026-11-25); study-views 24 runs (cost grows with M), 108 min
# (2026-11-25, two invocations: 64 + 44 min; docs/results_views.md).
SWEEP_OPTS ?= SOLVER.EPOCHS 2.0
study-beta: venv $(FASHION_MNIST)
	$(PY) tools/study.py --sweep beta --seeds 0 1 2 --jobs $(STUDY_JOBS) \
		--records docs/results_runs/beta $(SWEEP_OPTS)

study-views: venv $(FASHION_MNIST)
	$(PY) tools/study.py --sweep views --seeds 0 1 2 --jobs $(STUDY_JOBS) \
		--records docs/results_runs/views $(SWEEP_OPTS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

test: venv lint
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

# The SLURM tests on a two-node cluster started on this machine (root; installs Debian's
# slurm-wlm and munge when missing). The daemons are stopped again whatever the outcome.
test-slurm: venv
	trap 'tests/slurm/cluster.sh stop' EXIT; \
	tests/slurm/cluster.sh start && \
	eval "$$(tests/slurm/cluster.sh env)" && \
	LORAC_REQUIRE_SLURM=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -m slurm $(PYTEST_ARGS) \
		tests/pretrain/cluster/test_cluster_slurm.py

bench: venv
	$(PY) -m benchmarks.bench_nuclear_norm
	$(PY) -m benchmarks.bench_loss
	$(PY) -m benchmarks.bench_multicrop
	$(PY) -m benchmarks.bench_step --procs 1 2
	$(PY) -m benchmarks.check_bf16_conv

# For the day a GPU is lent (docs/performance.md). `make gpu-wheels` here, where PyPI is
# reachable, collects every wheel the project needs except torch/torchvision (the GPU machine
# brings its own CUDA build) into gpu_wheels/; `make gpu-check` there installs from it without
# internet when detectron2 or fvcore is missing, runs the CUDA tests, the throughput benchmark
# (synthetic data, 64 images per GPU, ResNet-50 3x224 + 5x96) and the step counter on CUDA, and
# writes output/gpu_check/*.json.
GPU_PY ?= python3
gpu-wheels: venv
	rm -rf gpu_wheels && mkdir -p gpu_wheels
	$(PY) tools/install_detectron2.py --wheel-dir gpu_wheels
	$(PY) -m pip freeze --exclude-editable | grep -v -E '^(torch|torchvision|triton|nvidia-|sal-detectron2|detectron2)' > gpu_wheels/requirements.txt
	$(PY) -m pip download -q --no-deps -d gpu_wheels -r gpu_wheels/requirements.txt
	$(PY) -m pip wheel -q --no-deps -w gpu_wheels .

gpu-check:
	@$(GPU_PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)" || \
		{ echo "gpu-check: no CUDA device visible to $(GPU_PY)"; exit 2; }
	@$(GPU_PY) -c "import detectron2, fvcore, lorac_configs" 2>/dev/null || \
		$(GPU_PY) -m pip install -q --no-index --find-links gpu_wheels \
			-r gpu_wheels/requirements.txt gpu_wheels/*detectron2*.whl gpu_wheels/lorac-*.whl
	mkdir -p output/gpu_check
	$(GPU_PY) -m pytest -q -p no:cacheprovider -k "cuda or gpu" tests | tee output/gpu_check/tests.txt
	$(GPU_PY) -m benchmarks.bench_throughput --device cuda --batch 64 \
		--json output/gpu_check/throughput.json
	$(GPU_PY) -m benchmarks.bench_step --device cuda --procs 1 \
		--json output/gpu_check/step.json

clean-venv:
	rm -rf .venv
