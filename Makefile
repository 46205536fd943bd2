# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both first build .venv at the repository root (`make install`).
# GPU users: `make install MXNET=mxnet-cu112`.
PYTHON ?= python3
MXNET  ?= mxnet==1.9.1
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# CUDA compile check of `make test` (no GPU needed): nvcc from PyPI, installed once into
# $(CUDA_DIR); see docs/gpu.md for why CUDA 13's wheel (the -cu11/-cu12 wheels hold no nvcc).
CUDA_NVCC  ?= nvidia-cuda-nvcc==13.5.37
CUDA_DIR   := $(VENV)/cuda
CUDA_STAMP := $(CUDA_DIR)/.installed

CUDA_CHECKED := $(CUDA_DIR)/.checked
# The oldest architecture CUDA 13 compiles for (T4) and Hopper (H100/H200).
CUDA_CHECK_ARCH ?= 75;90

.PHONY: install native demo test bench clean cuda-check

install: $(STAMP)

$(STAMP): setup.py constraints.txt
	@# the emulated cluster's tests (tests/test_emulated_cluster.py) need sshd; root only
	if [ "$$(id -u)" = 0 ] && [ ! -x /usr/sbin/sshd ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q openssh-server; fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt "$(MXNET)" numpy==1.23.5 gluoncv scikit-learn matplotlib pytest pytest-timeout
	$(PY) -m pip install -q -c constraints.txt --no-deps mlxtend -e .
	@# tests/test_import_structure.py: the import contracts of .importlinter
	$(PY) -m pip install -q -c constraints.txt import-linter
	@# kvstore 'dist_odsgd' is OD-SGD in every process of .venv, imported odsgd or not
	$(PY) -m odsgd_autoload
	@# Fashion-MNIST (make demo, tests/test_real_data.py): Debian's package, else MNIST-5k
	@if [ ! -d /usr/share/datasets/fashion-mnist ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q dataset-fashion-mnist >/dev/null || echo "apt-get install dataset-fashion-mnist failed: make demo uses MNIST-5k"; \
	  else echo "Fashion-MNIST missing: as root, apt-get install dataset-fashion-mnist (Debian/Ubuntu); make demo uses MNIST-5k meanwhile"; fi; fi
	$(PY) -m odsgd.native build
	touch $(STAMP)

# Rebuild the C++ operators (kvstore_ext/) against the installed MXNet.
native: $(STAMP)
	$(PY) -m odsgd.native build

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP) cuda-check
	$(PY) -m pytest -q tests

$(CUDA_STAMP): $(STAMP)
	$(PY) -m pip install -q --target $(CUDA_DIR) "$(CUDA_NVCC)"
	touch $(CUDA_STAMP)

# Compiles and links the CUDA kernels against the installed MXNet's headers; fails on error.
# Runs again only when kvstore_ext/ changes.
cuda-check: $(CUDA_CHECKED)

$(CUDA_CHECKED): $(CUDA_STAMP) $(wildcard kvstore_ext/*)
	ODSGD_CUDA_ARCH="$(CUDA_CHECK_ARCH)" $(PY) -m odsgd.native check-cuda --nvcc $(CUDA_DIR)/nvidia/cu13/bin/nvcc
	touch $(CUDA_CHECKED)

bench: $(STAMP)
	PY=$(PY) scripts/bench_throughput_suite.sh runs/bench

clean:
	rm -rf $(VENV) odsgd/lib build *.egg-info
