"""One cached git store per wheel: each release is imported once and its pack linked into every port."""

from __future__ import annotations

import json
from pathlib import Path

from rigstack.atomic import write_atomic
from rigstack.baseline import (Fingerprint, ignore_binaries, tracked_entries, wheel_files)
from rigstack.cache import cache_dir
from rigstack.gitrepo import PackageRepo


def wheel_baseline(repo: PackageRepo, wheel: Path, sha256: str, version: str, ref: str) -> tuple[str, str]:
    """(commit, fingerprint) of a wheel's text files. Each wheel is imported once, into a store in the cache, and its
    pack is hard-linked into every work area: a port then spends no time on baselines it has seen before."""
    store_dir = cache_dir() / "port-baselines"
    record = store_dir / f"{sha256}.json"
    store = PackageRepo(store_dir, git_dir=store_dir / "git")
    entry = json.loads(record.read_text()) if record.is_file() else None
    packs = [store.git_dir / "objects" / "pack" / name for name in (entry or {}).get("packs", [])]
    if entry is None or not packs or not all(pack.is_file() for pack in packs):
        store_dir.mkdir(parents=True, exist_ok=True)
        if not store.exists:
            store.init()
            store.run("config", "fastimport.unpackLimit", "0")  # always a pack, even for a tiny package
        printer = Fingerprint()
        commit = store.import_commit(tracked_entries(wheel_files(wheel, ignore_binaries), printer),
                                     f"baseline: vLLM {version} ({wheel.name})\n", f"refs/baselines/{sha256}")
        packs = sorted(store.packs())  # fast-import writes only blobs the store lacks: the commit needs them all
        entry = {"wheel": wheel.name, "commit": commit, "fingerprint": printer.value,
                 "packs": [pack.name for pack in packs]}
        write_atomic(record, json.dumps(entry, indent=2).encode())
    repo.link_packs(packs)
    repo.run("update-ref", ref, entry["commit"])
    return entry["commit"], entry["fingerprint"]
