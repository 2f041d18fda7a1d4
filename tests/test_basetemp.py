"""The suite's base folders: a run's own is claimed while it lives; earlier runs' go, all but the newest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from testing import basetemp


def _aged(folder: Path, seconds_ago: float) -> Path:
    os.utime(folder, (folder.stat().st_atime, folder.stat().st_mtime - seconds_ago))
    return folder


def test_prune_keeps_live_runs_this_run_and_the_newest_earlier_one(tmp_path: Path) -> None:
    live, live_lock = basetemp.claim(tmp_path)
    # pytest empties a given base folder by deleting and remaking it: the claim must outlive that (it did not when
    # the lock file lived inside, and a nested pytest pruned a running suite's folder)
    shutil.rmtree(live)
    live.mkdir()
    ended = []
    for age in (300, 200, 100):
        folder, lock = basetemp.claim(tmp_path)
        (folder / "popen-gw0").mkdir()
        lock.close()  # the run ended: its lock is released
        ended.append(_aged(folder, age))
    unclaimed = tmp_path / "rs-netns-a"  # no lock file: another test's folder (test_multinode_netns), maybe live
    unclaimed.mkdir()
    _aged(unclaimed, 400)
    unrelated = tmp_path / "other"
    unrelated.mkdir()
    _aged(live, 500)
    current, current_lock = basetemp.claim(tmp_path)

    removed = basetemp.prune(tmp_path, keep=current)

    assert sorted(removed) == sorted([ended[0], ended[1]])
    left = {live, ended[2], current}
    assert sorted(tmp_path.iterdir()) == sorted(
        [*left, *(folder.with_name(folder.name + ".in-use") for folder in left), unclaimed, unrelated])
    basetemp.release(current, current_lock)
    assert not current.exists() and not (tmp_path / f"{current.name}.in-use").exists()
    live_lock.close()


def test_a_claimed_folder_is_in_use_for_another_process_until_released(tmp_path: Path) -> None:
    base, lock = basetemp.claim(tmp_path)
    probe = ("import sys; from pathlib import Path; from testing import basetemp; "
             "print(basetemp._unused(Path(sys.argv[1])))")
    ask = [sys.executable, "-c", probe, str(base)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    assert subprocess.run(ask, capture_output=True, text=True, env=env, check=True).stdout.strip() == "False"
    lock.close()
    assert subprocess.run(ask, capture_output=True, text=True, env=env, check=True).stdout.strip() == "True"
