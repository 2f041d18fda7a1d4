"""Shared by the probe tests: running a script as a user would, and building small result files."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rigstack.probes.results import Metric, Provenance, Result

ROOT = Path(__file__).resolve().parents[1]
FAKE_SERVER = ROOT / "tests" / "probes" / "fake_server.py"


def run_script(name: str, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


# The script's own peak, read where it runs: VmHWM belongs to the process's memory since its exec. wait4's ru_maxrss
# does not do: Linux keeps the forking parent's high-water mark across exec, so a child of a test process that
# imported vLLM reported the parent's ~740 MiB.
_PEAK_CODE = """import atexit, runpy, sys
peak_file, sys.argv = sys.argv[1], sys.argv[2:]
def _peak():
    line = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    open(peak_file, "w").write(line.split()[1])
atexit.register(_peak)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_script_rss(name: str, *args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess[str], int]:
    """run_script, and the most memory the script's process held (its own peak RSS in bytes, VmHWM at its exit)."""
    with tempfile.TemporaryDirectory() as scratch:
        peak = Path(scratch) / "peak"
        done = subprocess.run([sys.executable, "-c", _PEAK_CODE, str(peak), str(ROOT / "scripts" / name), *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        return done, int(peak.read_text()) * 1024  # kB


def last_line(process: subprocess.CompletedProcess[str]) -> str:
    """The error as a user sees it: stderr joined (rich wraps long lines on a narrow terminal)."""
    return " ".join(process.stderr.split())


def make_result(kind: str = "bench", metrics: dict[str, tuple[float | None, str]] | None = None,
                samples: list[dict] | None = None, params: dict | None = None) -> Result:
    provenance = Provenance(url="http://127.0.0.1:1", model="m", profile=None, server_version=None, package=None,
                            stack_hash=None, params=params or {})
    return Result(kind=kind, provenance=provenance,
                  metrics={name: Metric(value=value, better=better) for name, (value, better) in
                           (metrics or {}).items()},
                  samples=samples or [])


# The probe server's flags: the glm47 parsers make qual's agent cases reach the tool-call path.
PARSERS = ("--enable-auto-tool-choice", "--tool-call-parser", "glm47", "--reasoning-parser", "glm45")


def site_from_env(env_var: str) -> Path | None:
    """A folder holding vllm/ from an env var (which may also name the vllm/ folder itself)."""
    value = os.environ.get(env_var)
    if not value:
        return None
    path = Path(value)
    return path.parent if (path / "__init__.py").is_file() else path


def venv_vllm() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec and spec.origin
    return Path(spec.origin).parent


def pristine_site() -> Path:
    """RIGSTACK_PRISTINE_VLLM, else the folder holding this venv's (unpatched) vllm. Named explicitly, so the
    server is pristine even when the test process itself runs with a patched PYTHONPATH."""
    return site_from_env("RIGSTACK_PRISTINE_VLLM") or venv_vllm().parent


def probe_server(vllm_server, site: Path):  # noqa: ANN001, ANN201 - the launcher plugin's factory and server
    """The one server shape every probe test asks for, so the fidelity gate's pristine boot is shared."""
    return vllm_server(extra_args=PARSERS, env={"PYTHONPATH": str(site)})
