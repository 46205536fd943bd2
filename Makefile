# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both first build .venv at the repository root (`make install`).
# GPU users: `make install MXNET=mxnet-cu112`.
PYTHON ?= python3
MXNET  ?= mxnet==1.9.1
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install native demo test bench clean

install: $(STAMP)

$(STAMP): setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt "$(MXNET)" numpy==1.23.5 gluoncv scikit-learn matplotlib pytest pytest-timeout
	$(PY) -m pip install -q -c constraints.txt --no-deps -e .
	$(PY) -m odsgd.native build
	touch $(STAMP)

# Rebuild the C++ operators (kvstore_ext/) against the installed MXNet.
native: $(STAMP)
	$(PY) -m odsgd.native build

demo: $(STAMP)
	$(PY) scripts/demo.py

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) -m odsgd.bench throughput --batch-size 1024 --bandwidth-mbit 2000,4000,6000,0 \
		--repeats 3 --steps 30 --skip 8 --json results/throughput_mlp.json

clean:
	rm -rf $(VENV) odsgd/lib build *.egg-info
