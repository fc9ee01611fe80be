# dlcsniff — the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
WVENV := .venv-workloads
# chromium: the report's tests open it in a real browser (headless); xz-utils, zstd: compressed captures in the tests;
# python3-simgrid: `dlcsniff simulate`'s SimGrid; clang, libbpf-dev (bpf_helpers.h, libbpf.so.1): the capture
# daemon's BPF objects, built here once (sniffer/bpf_objects.py); gcc, libc6-dev, python3-dev: the decoders' C
# extensions
APT_PACKAGES := tcpdump tshark libpcap-dev xz-utils zstd iproute2 ethtool procps libbpf-dev \
	chromium python3-simgrid clang gcc libc6-dev python3-dev
# C sources pip builds into the package (pyproject.toml: ext-modules), each with a pure-Python fallback
C_SOURCES := decoders/inputs/record_walk.c decoders/tcp_headers.c decoders/protocols/zmtp_scan.c
RUN_CAPTURE ?= pcaps/mxnet_sync
# BytePS's ps-lite (from the byteps sdist on PyPI) and the programs the BytePS jobs run: `make byteps`
BYTEPS_BUILD := build/byteps
BYTEPS_APT_PACKAGES := libzmq3-dev g++ make python3-dev

# The full Gloo matrix (`make gloo-matrix`): one job per world size, recorded, checked, its captures deleted
# (~1-6 GB each while it is checked); the records, logs and per-cell tables stay in GLOO_MATRIX_OUT.
GLOO_MATRIX_OUT ?= out/gloo-matrix
GLOO_MATRIX_WORLD_SIZES ?= 2 3 4 5 6 7 8

.PHONY: run test bench setup sys bpf bytecode workloads byteps pcaps schema gloo-matrix clean

setup: sys $(VENV)/.installed bpf bytecode

# Our modules' bytecode, compiled here (only what changed since): an editable install leaves it to the first run,
# and where PYTHONDONTWRITEBYTECODE=1 is set (as on these machines) every run compiled them from source, ~0.13 s
# of a small capture's decode (tests/bench/measure.py compiles them before timing for the same reason).
bytecode: $(VENV)/.installed
	$(VENV)/bin/python -m compileall -q dlcsniff decoders analysis sniffer lab

# The capture daemon's BPF programs, compiled once into CO-RE objects libbpf loads as they are (sniffer/probes/build/,
# named by a digest of their sources: an edited source is rebuilt here, never loaded stale)
bpf: $(VENV)/.installed
	$(VENV)/bin/python -m dlcsniff.sniffer.bpf_objects

# System packages: installed only when one is missing (apt-get needs root, as on these machines).
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

sys:
	$(call apt_install,$(APT_PACKAGES))
	@command -v chromium >/dev/null || { echo "chromium is missing after apt-get install chromium: the report's browser tests need it" >&2; exit 1; }

$(VENV)/.installed: pyproject.toml Makefile $(C_SOURCES)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	# the compiled parts are optional to pip (each has a fallback), not to `make setup`: say so if one failed
	$(VENV)/bin/python -c 'import dlcsniff.decoders.inputs._record_walk, dlcsniff.decoders._tcp_headers, \
	  dlcsniff.decoders.protocols._zmtp_scan' || \
	  { echo "a C extension ($(C_SOURCES)) did not build: see pip's output above" >&2; exit 1; }
	# MLCommons' own Chakra reader, the tests' independent check of our .et writer. --no-deps: its declared
	# dependencies pull in ~70 packages (HTA, Jupyter); its schema and reader need only protobuf.
	$(VENV)/bin/pip install -q --no-deps mlc-chakra==1.0.0
	# `dlcsniff simulate`'s engines: SimGrid 3.32 from Debian (python3-simgrid: one compiled module in the system
	# dist-packages, linked into the venv, nothing else of dist-packages) and ns-3 3.44 from PyPI (its wheel, with
	# cppyy bindings).
	ln -sfn "$$(/usr/bin/python3 -c 'import simgrid; print(simgrid.__file__)' 2>/dev/null)" \
	  "$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
	$(VENV)/bin/pip install -q ns3==3.44.post0
	touch $@

# The real jobs that produce captures: MXNet 1.9.1 (needs numpy 1.23.5), PyTorch CPU, pyzmq.
workloads: $(WVENV)/.installed
$(WVENV)/.installed:
	test -x $(WVENV)/bin/python || $(PYTHON) -m venv $(WVENV)
	$(WVENV)/bin/pip install -q --upgrade pip
	$(WVENV)/bin/pip install -q mxnet==1.9.1 numpy==1.23.5 pyzmq torch==2.13.0
	touch $@

# Build what the BytePS jobs run (lab/byteps/build.sh: idempotent, ~2 min the first time). Not needed by `make test`,
# which reads the committed captures.
byteps: setup
	$(call apt_install,$(BYTEPS_APT_PACKAGES))
	PY=$(VENV)/bin/python lab/byteps/build.sh $(BYTEPS_BUILD)

# Re-record the bundled captures from real jobs (root: network namespaces + tcpdump); the small Gloo matrix
# (2 and 3 ranks, up to 65 KB a tensor: lab/gloo_matrix.py) among them.
pcaps: setup workloads byteps
	$(VENV)/bin/python -m lab.record all --out pcaps --workload-python $(WVENV)/bin/python
	$(VENV)/bin/python -m lab.byteps.record --out pcaps --bin $(BYTEPS_BUILD)/bin

# The whole Gloo matrix (issue 10 item 4: world sizes 2-8, 1 B to 64 MiB, every op, 8 dtypes; root, ~25 min on 2
# cores), each job checked on every rank against the ranks' records, as recorded and with 10 % segment loss.
# Not part of `make test`, which checks the bundled small matrix.
gloo-matrix: setup workloads
	@mkdir -p $(GLOO_MATRIX_OUT); status=0; \
	for k in $(GLOO_MATRIX_WORLD_SIZES); do \
	  job=$(GLOO_MATRIX_OUT)/gloo_matrix_k$$k; \
	  $(VENV)/bin/python -m lab.record gloo-matrix --world-sizes $$k --out $(GLOO_MATRIX_OUT) \
	    --workload-python $(WVENV)/bin/python || { status=1; continue; }; \
	  if $(VENV)/bin/python -m tests.support.gloo_matrix $$job --table $$job/cells.tsv > $$job/check.txt; \
	  then rm -f $$job/*.pcap; else status=1; fi; \
	  tail -n 1 $$job/check.txt; \
	done; exit $$status

run: setup
	$(VENV)/bin/dlcsniff decode $(RUN_CAPTURE) --out out/run --force
	$(VENV)/bin/dlcsniff stats out/run --out out/run/stats --force

test: setup workloads
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider tests

# SCHEMA.md, the reference of every table, from decoders/schema.py and analysis/stats_schema.py (a test holds
# the committed file to what this writes)
schema: setup
	$(VENV)/bin/dlcsniff schema --markdown > SCHEMA.md

bench: setup workloads
	$(VENV)/bin/python -m tests.bench

clean:
	rm -rf out bench-out
