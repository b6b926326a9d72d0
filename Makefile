# Two commands do all set-up on a fresh machine: `make demo` and `make test` (see README).
# bash, for `set -o pipefail` in gpu-check's pipes (dash's sh may lack it).
SHELL := /bin/bash
PY := .venv/bin/python
VENV_STAMP := .venv/.installed-v1
FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
PYTEST_ARGS ?=

.PHONY: venv demo study study-beta study-views test test-processes test-protocols lint format bench test-slurm test-golden-isa test-compile test-oldest-torch clean-venv gpu-wheels gpu-env gpu-quick gpu-check gpu-check-tests gpu-check-throughput gpu-check-compiled gpu-check-costs

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
# (`make study`). Writes docs/results.md and .png; each run's record goes to docs/results_runs/.
# STUDY_JOBS at once, one process and nproc/STUDY_JOBS threads each (a ResNet-18 at 24 px gains
# little from a second thread). Ctrl-C saves the runs in progress; `make study` again resumes
# where it stopped.
STUDY_JOBS ?= 3
study: venv $(FASHION_MNIST)
	$(PY) tools/study.py --output-dir output/study --results docs/results.md --jobs $(STUDY_JOBS) \
		--records docs/results_runs/study

# A study writes docs/ only when --results names it (these targets); a quick look writes its page
# under its --output-dir.
# The paper's two ablations at demo scale, 3 seeds each, 2 epochs per run (beta = inf for the
# first epoch, as the paper's first half), with the demo's data and recipe. Each finished run's
# results are also kept in docs/results_runs/<sweep>/ (committed), so a sweep stopped half-way,
# even on another machine, goes on where it stopped. Measured on 2 cores with STUDY_JOBS=3:
# study-beta 18 runs, 59 min; study-views 24 runs (cost grows with M), 108 min (two
# invocations: 64 + 44 min; docs/results_views.md).
SWEEP_OPTS ?= SOLVER.EPOCHS 2.0
study-beta: venv $(FASHION_MNIST)
	$(PY) tools/study.py --sweep beta --seeds 0 1 2 --jobs $(STUDY_JOBS) \
		--records docs/results_runs/beta --results docs/results_beta.md $(SWEEP_OPTS)

study-views: venv $(FASHION_MNIST)
	$(PY) tools/study.py --sweep views --seeds 0 1 2 --jobs $(STUDY_JOBS) \
		--records docs/results_runs/views --results docs/results_views.md $(SWEEP_OPTS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# Two pytest workers (pytest-xdist; each test module stays on one worker, so its module-scoped
# fixtures run once) and the 25 slowest tests after the summary. PYTEST_ARGS="-n 0": one process.
# The tests that start several training processes are make test-processes' (in CI).
TEST_WORKERS ?= 2
test: venv lint
	$(PY) -m pytest -q -m "not compile and not processes and not protocols" -n $(TEST_WORKERS) --dist loadfile \
		--durations=25 $(PYTEST_ARGS) tests

# Several training processes per test (gloo pairs against one process, a signal to one rank, a
# study's --jobs pool, Ctrl-C and kill of a study): each starts 2-5 Pythons. About 6 min on 2 cores.
test-processes: venv
	$(PY) -m pytest -q -m processes -n $(TEST_WORKERS) --dist loadfile --durations=10 \
		$(PYTEST_ARGS) tests

# Every transfer protocol's shipped config trained a few iterations on a tiny dataset written in
# that dataset's real layout (VOC, LVIS, Cityscapes, ADE20K, the 13 classification sets,
# fine-tuning, SVMs...): one short run per protocol, too many for make test's 10 minutes.
test-protocols: venv
	$(PY) -m pytest -q -m protocols -n $(TEST_WORKERS) --dist loadfile --durations=10 \
		$(PYTEST_ARGS) tests

# torch.compile (aot_eager) of every shipped pretraining config at tiny sizes, three steps per
# beta phase: one graph per phase, no recompile (about 20 s per config on 2 cores); the one-graph
# traces under autocast and the bfloat16 compiled step against the eager one.
test-compile: venv
	$(PY) -m pytest -q -m compile $(PYTEST_ARGS) tests

# The oldest torch setup.py allows (OLDEST_TORCH), installed beside the venv into .oldest-torch/
# (no dependencies: the venv's own; about 1 GB from PyPI, once) and put before it on the path:
# the quick GPU check's CPU toy and its planted faults, SyncBN's two processes against one, and
# the compile checks of the three IN-1K configs (every shipped config, make test-compile's whole
# set, takes ~9 min here: IN-100's and the demo's differ in sizes, not in what compiles), the
# one-graph traces, the compiled step against the eager one, the recompile announcement.
OLDEST_TORCH := torch==2.11.0 torchvision==0.26.0
OLDEST_DIR := .oldest-torch
OLDEST_TESTS := tests/benchmarks/test_gpu_scripts_at_toy_size.py tests/pretrain/modeling/test_norm.py \
	tests/pretrain/engine/test_recompiles.py "tests/pretrain/modeling/test_compiled_configs.py" \
	tests/pretrain/engine/test_static_step.py
OLDEST_SELECT := not gpu_costs and (not test_compiled_configs or in1k) and (not test_static_step \
	or one_graph or compiled_step_equals)
$(OLDEST_DIR)/.installed-$(firstword $(OLDEST_TORCH)): setup.py | $(VENV_STAMP)
	$(PY) -m pip install -q --no-deps --upgrade --target $(OLDEST_DIR) $(OLDEST_TORCH)
	touch $@

test-oldest-torch: venv $(OLDEST_DIR)/.installed-$(firstword $(OLDEST_TORCH))
	PYTHONPATH=$(CURDIR)/$(OLDEST_DIR):$(CURDIR) $(PY) -c "import torch, sys; \
		print('torch', torch.__version__, 'from', torch.__file__); \
		sys.exit(torch.__version__.split('+')[0] != '$(word 2,$(subst ==, ,$(firstword $(OLDEST_TORCH))))')"
	PYTHONPATH=$(CURDIR)/$(OLDEST_DIR):$(CURDIR) $(PY) -m pytest -q -p no:cacheprovider \
		-n $(TEST_WORKERS) --dist loadfile --durations=10 -k "$(OLDEST_SELECT)" \
		$(PYTEST_ARGS) $(OLDEST_TESTS)

# The SLURM tests on a two-node cluster started on this machine (root; installs Debian's
# slurm-wlm and munge when missing): pretraining jobs, and a study through --executor slurm.
# The daemons are stopped again whatever the outcome.
test-slurm: venv
	trap 'tests/slurm/cluster.sh stop' EXIT; \
	tests/slurm/cluster.sh start && \
	eval "$$(tests/slurm/cluster.sh env)" && \
	LORAC_REQUIRE_SLURM=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -m slurm $(PYTEST_ARGS) \
		tests/pretrain/cluster/test_cluster_slurm.py tests/transfer/study/test_study_slurm.py

# tests/golden under other CPUs' kernels (oneDNN limited to AVX512-BF16 without AMX, AVX512,
# AVX2): each run compares within the spread measured between CPUs and must still catch the
# planted changes (tests/golden/compare.py). About 1 min per instruction set on 2 cores.
GOLDEN_ISAS := AVX512_CORE_BF16 AVX512_CORE AVX2
test-golden-isa: venv
	for isa in $(GOLDEN_ISAS); do echo "== ONEDNN_MAX_CPU_ISA=$$isa"; \
		ONEDNN_MAX_CPU_ISA=$$isa $(PY) -m pytest -q $(PYTEST_ARGS) tests/golden || exit 1; done

bench: venv
	$(PY) -m benchmarks.bench_nuclear_norm
	$(PY) -m benchmarks.bench_loss
	$(PY) -m benchmarks.bench_multicrop
	$(PY) -m benchmarks.bench_step --procs 1 2
	$(PY) -m benchmarks.bench_loader
	$(PY) -m benchmarks.check_bf16_conv

# For a machine with a GPU (docs/performance.md, "make gpu-check"). `make gpu-wheels` here, where
# PyPI is reachable, collects the wheels the project needs beyond what a CUDA PyTorch image brings
# (torch, torchvision, numpy, pillow, matplotlib, scikit-learn, pytest, ...): detectron2 (pure
# Python), fvcore, iopath, submitit, omegaconf and their pure-Python needs, and pycocotools for
# CPython 3.10, 3.11 and 3.12. `make gpu-check` there installs them without internet (into
# output/gpu_check/site, only when detectron2 or fvcore is missing), runs the CUDA tests, the
# throughput ratio (benchmarks/bench_throughput.py: the step of each shipped IN-1K config at 32
# and 64 images per GPU against a plain ResNet-50 step, eager and compiled, in one process), the
# norm's sync cost and LARS's launches (benchmarks/bench_gpu_costs.py), CUDA's own sync report
# (benchmarks/cuda_sync_report.py) and the step counter on CUDA (2 processes too with 2+ GPUs),
# and writes every figure to output/gpu_check/.
# It exits non-zero when a test or a benchmark fails (the pipes run under pipefail).
GPU_PY ?= python3
GPU_OUT := output/gpu_check
GPU_PURE := fvcore==0.1.5.post20221221 iopath==0.1.10 yacs==0.1.8 submitit==1.5.4 \
	omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 hydra-core==1.3.8 termcolor==3.3.0
GPU_BINARY := pycocotools==2.0.11
GPU_PYTHONS := 3.10 3.11 3.12
# the modules holding tests marked `cuda` (collecting only these keeps the GPU image's
# packages enough: no test module of the transfer side is imported there)
GPU_TESTS := tests/pretrain/engine/test_gpu.py tests/pretrain/data/test_transforms.py \
	tests/pretrain/data/test_color_static.py tests/pretrain/losses/test_nuclear_norm.py \
	tests/pretrain/modeling/test_shuffle.py
GPU_STEP_CONFIGS := configs/pretrain/in1k_r50_lorac_200ep.yaml configs/pretrain/in1k_r50_mocom_200ep.yaml
# the static step compiled with CUDA graphs, measured against the eager step of the
# same config in the same process (bench_throughput --switch)
GPU_SWITCH := SOLVER.COMPILE.ENABLED True SOLVER.COMPILE.MODE reduce-overhead
gpu-wheels: venv
	rm -rf gpu_wheels && mkdir -p gpu_wheels
	$(PY) tools/install_detectron2.py --wheel-dir gpu_wheels
	$(PY) -m pip wheel -q --no-deps -w gpu_wheels $(GPU_PURE)
	for v in $(GPU_PYTHONS); do $(PY) -m pip download -q --no-deps --only-binary=:all: \
		--python-version $$v --implementation cp --platform manylinux2014_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d gpu_wheels \
		$(GPU_BINARY) || exit 1; done
	printf '%s\n' sal-detectron2 $(GPU_PURE) $(GPU_BINARY) > gpu_wheels/requirements.txt

# The GPU set-up every GPU target shares: the Python, a visible CUDA device, the wheels.
gpu-env:
	@$(GPU_PY) -c "import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 2)" \
		|| { echo "error: gpu-check: $(GPU_PY) is Python $$($(GPU_PY) -c 'import platform; \
		print(platform.python_version())'); gpu_wheels/ covers 3.10 to 3.12 (set GPU_PY)"; exit 2; }
	@$(GPU_PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)" || \
		{ echo "error: gpu-check: no CUDA device visible to $(GPU_PY)"; exit 2; }
	@mkdir -p $(GPU_OUT)
	@$(GPU_PY) -c "import detectron2, fvcore, iopath, submitit, omegaconf" 2>/dev/null || \
		{ test -f gpu_wheels/requirements.txt || { echo "error: gpu-check: detectron2/fvcore \
		are missing and gpu_wheels/ is not here: run make gpu-wheels where PyPI is reachable and \
		bring gpu_wheels/ along"; exit 2; }; \
		echo "installing gpu_wheels/ into $(GPU_OUT)/site"; \
		$(GPU_PY) -m pip install -q --no-index --no-deps --find-links gpu_wheels \
			--target $(GPU_OUT)/site -r gpu_wheels/requirements.txt || exit 1; }

GPU_RUN = set -o pipefail; export PYTHONPATH=$(abspath $(GPU_OUT))/site:$(CURDIR);
# The one call that decides the step (benchmarks/gpu_quick.py): within its 540 s budget (a part
# that would not fit is skipped and recorded), each part's figures in
# output/gpu_check/quick/quick.json as it ends; exits 1 on a failed part or check (a recompile, a
# graph break, numbers off eager's, no CUDA graph launched). Its cache/ folder brought back makes
# a rerun start warm.
gpu-quick: gpu-env
	$(GPU_RUN) $(GPU_PY) -m benchmarks.gpu_quick --out $(GPU_OUT)/quick 2>&1 \
		| tee $(GPU_OUT)/quick.txt

# The full set, one target per GPU window (each well under 10 minutes on one H100); all of them
# run (-k) when one fails, and the status says whether any failed.
GPU_CHECKS := gpu-check-tests gpu-check-throughput gpu-check-compiled gpu-check-costs
gpu-check: gpu-env
	@$(MAKE) -k --no-print-directory $(GPU_CHECKS); status=$$?; \
	echo "gpu-check: figures in $(GPU_OUT)/"; exit $$status

gpu-check-tests: gpu-env
	$(GPU_RUN) $(GPU_PY) -m pytest -q -p no:cacheprovider -m cuda $(GPU_TESTS) 2>&1 \
		| tee $(GPU_OUT)/tests.txt

gpu-check-throughput: gpu-env
	$(GPU_RUN) $(GPU_PY) -m benchmarks.bench_throughput --device cuda --batch 32 64 \
		--json $(GPU_OUT)/throughput.json 2>&1 | tee $(GPU_OUT)/throughput.txt

# the compiled step with CUDA graphs against the eager step of the same config, one batch size a
# command (two compiles each)
gpu-check-compiled: gpu-env
	for b in 32 64; do $(GPU_RUN) $(GPU_PY) -m benchmarks.bench_throughput --device cuda \
		--batch $$b --no-compile --configs configs/pretrain/in1k_r50_lorac_200ep.yaml \
		--switch $(GPU_SWITCH) --json $(GPU_OUT)/throughput_compiled_$$b.json 2>&1 \
		| tee $(GPU_OUT)/throughput_compiled_$$b.txt || exit 1; done

gpu-check-costs: gpu-env
	status=0; $(GPU_RUN) \
	$(GPU_PY) -m benchmarks.bench_gpu_costs --json $(GPU_OUT)/costs.json 2>&1 \
		| tee $(GPU_OUT)/costs.txt || status=1; \
	$(GPU_PY) -m benchmarks.cuda_sync_report --json $(GPU_OUT)/sync.json 2>&1 \
		| tee $(GPU_OUT)/sync.txt || status=1; \
	$(GPU_PY) -m benchmarks.cuda_sync_report --opts SOLVER.STATIC_STEP True \
		--json $(GPU_OUT)/sync_static.json 2>&1 | tee $(GPU_OUT)/sync_static.txt || status=1; \
	$(GPU_PY) -m benchmarks.bench_step --device cuda --procs 1 --config $(GPU_STEP_CONFIGS) \
		--json $(GPU_OUT)/step.json 2>&1 | tee $(GPU_OUT)/step.txt || status=1; \
	if [ "$$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then \
		$(GPU_PY) -m benchmarks.bench_step --device cuda --procs 2 --config $(GPU_STEP_CONFIGS) \
			--json $(GPU_OUT)/step2.json 2>&1 | tee $(GPU_OUT)/step2.txt || status=1; \
	fi; exit $$status

clean-venv:
	rm -rf .venv
