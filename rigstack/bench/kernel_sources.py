"""Load the SM8x fallback modules (and patch 0011's host collectives) by file path, with or without vLLM.

The kernel modules of patches 0008-0010 import only torch and triton (and each
other, relatively), so they can run where importing vLLM is impossible (a GPU
machine without vLLM) or unwanted. Where the files come from:

- a ``vllm`` package is importable (CI: the venv's package, patched in place;
  patchtests: the patched or the pristine package on PYTHONPATH): its own files,
  so a package that lacks the fallbacks fails these tests;
- no ``vllm`` at all, or RIGSTACK_SM8X_SOURCE=patches: the patch stack itself,
  new files from their hunks and changed files (the kpool module) from the
  pinned copy in RIGSTACK_VLLM_BASE with the stack's hunks applied exactly.

The files are copied into a private temporary package and imported from there
without importing vllm. ``interpret=True`` imports a second copy whose Triton
kernels run in Triton's CPU interpreter, which is how CI (no GPU) runs them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATCHES_DIR = ROOT / "patches"
OPS = "vllm/v1/attention/ops/"
KERNEL_MODULES = ("fp8_e4m3_sw", "triton_sparse_mla_sm8x", "triton_indexer_sm8x")
KPOOL = "vllm/models/glm5next/nvidia/ops/kpool_compress.py"
COMMON = "vllm/v1/attention/ops/common.py"
COMMUNICATORS = "vllm/distributed/device_communicators/"
HOST_COLLECTIVES = ("host_collectives", "host_collectives_triton")
STAGE_TIMING = "vllm/v1/worker/stage_timing.py"
STAND_INS = "rigstack.bench.vllm_stand_ins"
# The stage timer's vLLM imports and what stands in for them (its platform question answered by torch).
_STAGE_TIMING_IMPORTS = (
    ("from vllm.logger import init_logger\n", "from logging import getLogger as init_logger\n"),
    ("from vllm.platforms import current_platform\n", f"from {STAND_INS} import CudaPlatform as current_platform\n"))
INDEXER_TOPK = "vllm/model_executor/layers/indexer_topk.py"
# vLLM's compiled CUDA ops (its top-k kernels among them), a file of the pinned GPU package.
CUDA_OPS = "_C_stable_libtorch.abi3.so"
# The decode top-k dispatcher's: the ops are the compiled library's own (vLLM's wrappers pass their arguments
# straight on); the config is never read, as the tests name the backend.
_INDEXER_TOPK_IMPORTS = (
    ("from vllm import _custom_ops as ops\n", "ops = torch.ops._C\n"),
    ("from vllm.config import get_current_vllm_config\n", ""),
    ("from vllm.platforms import current_platform\n", f"from {STAND_INS} import CudaPlatform as current_platform\n"),
    ("from vllm.utils.flashinfer import has_flashinfer\n", f"from {STAND_INS} import has_flashinfer\n"),
    ("from vllm.v1.worker.workspace import current_workspace_manager\n",
     f"from {STAND_INS} import WorkspaceManager as current_workspace_manager\n"))
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _file_sections(patch_text: str) -> dict[str, list[str]]:
    """Path -> the diff lines of that file (header lines included)."""
    _, sep, body = patch_text.partition("\n---\n")
    if not sep:  # not a patch (or one still being written): touches nothing
        return {}
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in body.splitlines():
        if line.startswith("diff --git a/"):
            path = line.split(" b/", 1)[1]
            current = sections.setdefault(path, [])
        elif current is not None:
            current.append(line)
    return sections


def _apply(base: list[str], diff: list[str]) -> list[str]:
    """Apply one file's hunks exactly (no offset, no fuzz), like apply.py."""
    out: list[str] = []
    pos = 0
    i = 0
    while i < len(diff):
        m = _HUNK.match(diff[i])
        i += 1
        if not m:
            continue
        start = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
        out.extend(base[pos:start])
        pos = start
        while i < len(diff) and not diff[i].startswith("@@"):
            tag, text = diff[i][:1], diff[i][1:]
            i += 1
            if tag == "\\":
                continue
            if tag in (" ", "-"):
                if base[pos] != text:
                    raise ValueError(f"hunk context mismatch at line {pos + 1}: {text!r}")
                pos += 1
            if tag in (" ", "+"):
                out.append(text)
    return out + base[pos:]


def installed_package() -> Path | None:
    """The importable vllm package's folder, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def _base_dir() -> Path | None:
    env = os.environ.get("RIGSTACK_VLLM_BASE")
    return Path(env) if env else installed_package()


def source(path: str) -> str:
    """The text of package file ``path`` ("vllm/...") as these tests see it (see above)."""
    package = installed_package()
    if package is None or os.environ.get("RIGSTACK_SM8X_SOURCE") == "patches":
        return patched_source(path)
    file = package.parent / path
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: this vllm package lacks the patch that adds it")
    return file.read_text()


def patched_source(path: str) -> str:
    """The text of package file ``path`` ("vllm/...") after the whole stack."""
    lines: list[str] | None = None
    for patch in sorted(PATCHES_DIR.glob("[0-9][0-9][0-9][0-9]-*.patch")):
        diff = _file_sections(patch.read_text()).get(path)
        if diff is None:
            continue
        if lines is None:
            if any(line.startswith("new file mode") for line in diff[:3]):
                lines = []
            else:
                base = _base_dir()
                if base is None or not (base.parent / path).is_file():
                    raise FileNotFoundError(f"no pinned copy of {path}: set RIGSTACK_VLLM_BASE")
                lines = (base.parent / path).read_text().splitlines()
        lines = _apply(lines, diff)
    if lines is None:  # a file the stack leaves as it is: the pinned copy
        base = _base_dir()
        if base is None or not (base.parent / path).is_file():
            raise FileNotFoundError(f"no patch in {PATCHES_DIR} touches {path} and no pinned copy of it: set "
                                    "RIGSTACK_VLLM_BASE")
        return (base.parent / path).read_text()
    return "\n".join(lines) + "\n"


def _kpool_source() -> str:
    # The patched kpool module's vLLM imports become plain triton, the soft-FP8 module beside it, and (from 0.34.0)
    # the MX-scale switch off (DeepGEMM's MX path: never on the SM8x cards the fallback serves) with the one jit
    # helper it names copied from the package's own common.py.
    src = source(KPOOL)
    src = src.replace("from vllm.triton_utils import tl, triton\n", "import triton\nimport triton.language as tl\n")
    src = src.replace("from vllm.utils.deep_gemm import mqa_logits_use_mx_scales\n",
                      "def mqa_logits_use_mx_scales():\n    return False\n\n\n")
    if "from vllm.v1.attention.ops.common import pack_ue8m0_x4\n" in src:
        helper = re.search(r"@triton\.jit\ndef pack_ue8m0_x4\(.*?(?=\n\n\n)", source(COMMON), re.DOTALL)
        if helper is None:
            raise FileNotFoundError(f"{COMMON} has no pack_ue8m0_x4 for the kpool module")
        src = src.replace("from vllm.v1.attention.ops.common import pack_ue8m0_x4\n", helper.group(0) + "\n\n\n")
    return src.replace("from vllm.v1.attention.ops.fp8_e4m3_sw import", "from .fp8_e4m3_sw import")


def load(interpret: bool = False, with_kpool: bool = False) -> types.SimpleNamespace:
    """Import the kernel modules (and optionally the patched kpool module)."""
    sources = {name: source(OPS + name + ".py") for name in KERNEL_MODULES}
    if with_kpool:
        sources["kpool_compress"] = _kpool_source()
    return _import_private("sm8x_ops", sources, interpret)


def load_stage_timing() -> types.ModuleType:
    """Patches 0003 and 0012's stage timer without vLLM (the GPU machine has none): its two vLLM imports, the logger
    and the platform's CUDA check, become the standard library's logger and torch's own check; the clock, the log
    lines and the trace are the package's code."""
    src = _stand_in(STAGE_TIMING, source(STAGE_TIMING), _STAGE_TIMING_IMPORTS, "load_stage_timing")
    return _import_private("stage_timing", {"stage_timing": src}, interpret=False).stage_timing


def _stand_in(path: str, src: str, imports: tuple[tuple[str, str], ...], loader: str) -> str:
    for vllm_import, plain in imports:
        if vllm_import not in src:
            raise FileNotFoundError(f"{path} no longer imports {vllm_import.strip()!r}: update {loader}")
        src = src.replace(vllm_import, plain)
    return src


def cuda_ops_library() -> Path:
    """vLLM's compiled CUDA ops: the importable package's, else (or with RIGSTACK_SM8X_SOURCE=patches) the pinned
    package's in RIGSTACK_VLLM_BASE."""
    package = installed_package()
    if package is None or os.environ.get("RIGSTACK_SM8X_SOURCE") == "patches":
        package = _base_dir()
    if package is None or not (package / CUDA_OPS).is_file():
        raise FileNotFoundError(f"no {CUDA_OPS} in {package or 'RIGSTACK_VLLM_BASE (unset)'}: point "
                                "RIGSTACK_VLLM_BASE at the pinned GPU package (python3 apply.py apply --until 0000 "
                                "--out DIR; DIR/vllm)")
    return package / CUDA_OPS


def load_indexer_topk() -> types.ModuleType:
    """Patch 0007's decode top-k dispatcher (SparseIndexerTopk, the canonical order) without importing vLLM: its five
    vLLM imports stand in as _INDEXER_TOPK_IMPORTS says. Its CUDA backends need load_cuda_ops() first; the torch
    backend runs anywhere."""
    src = _stand_in(INDEXER_TOPK, source(INDEXER_TOPK), _INDEXER_TOPK_IMPORTS, "load_indexer_topk")
    return _import_private("indexer_topk", {"indexer_topk": src}, interpret=False).indexer_topk


def load_cuda_ops() -> None:
    """Register vLLM's compiled CUDA ops (cuda_ops_library()) in torch.ops._C, once a process."""
    import torch

    if not hasattr(torch.ops._C, "top_k_per_row_decode"):
        torch.ops.load_library(str(cuda_ops_library()))


def load_host_collectives() -> types.SimpleNamespace:
    """Import patch 0011's host collectives (torch only; its Triton flag kernels load on first CUDA use)."""
    sources = {name: source(COMMUNICATORS + name + ".py") for name in HOST_COLLECTIVES}
    return _import_private("host_collectives", sources, interpret=False)


def load_module(path: str, interpret: bool = False) -> types.ModuleType:
    """Import one torch+triton-only package file ("vllm/.../name.py"), found as ``source`` finds it."""
    name = Path(path).stem
    return getattr(_import_private(name, {name: source(path)}, interpret), name)


def load_expert_offload(interpret: bool = False) -> types.SimpleNamespace:
    """Import patch 0014's expert offload module with 0013's kernels and 0019's prefetch and shared staging beside it
    (its relative imports)."""
    names = ("expert_offload_kernels", "expert_prefetch", "expert_staging", "expert_offload")
    sources = {name: source(f"vllm/model_executor/layers/fused_moe/{name}.py") for name in names}
    return _import_private("expert_offload", sources, interpret)


def _import_private(prefix: str, sources: dict[str, str], interpret: bool) -> types.SimpleNamespace:
    """Write the sources into a private package (named by their hash) on sys.path and import them from there."""
    digest = hashlib.sha256(repr(sorted(sources.items())).encode()).hexdigest()[:12]
    package = f"{prefix}_{'interp' if interpret else 'native'}_{digest}"
    root = Path(tempfile.gettempdir()) / "rigstack-sm8x"
    pkg_dir = root / package
    pkg_dir.mkdir(parents=True, exist_ok=True)
    (pkg_dir / "__init__.py").write_text("")
    for name, text in sources.items():
        target = pkg_dir / f"{name}.py"
        if not target.exists() or target.read_text() != text:
            # Per process: pytest-xdist workers write the same package at once.
            tmp = target.with_name(f"{name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, target)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    previous = os.environ.get("TRITON_INTERPRET")
    # Triton decides interpreted-or-compiled when a kernel is decorated.
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        modules = {name: importlib.import_module(f"{package}.{name}") for name in sources}
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return types.SimpleNamespace(**modules)
