"""rigstack.port.classify on its own: which change makes a replayed patch clean, refreshed or moved."""

from __future__ import annotations

from pathlib import Path

from rigstack.gitrepo import PackageRepo
from rigstack.port.classify import _hunk_bodies, _moved, _without_index

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
