"""Wheels from the package index, found as pip finds them and downloaded into the cache by pip itself: a
release's wheel is the one pip would install for this interpreter (old releases ship manylinux1 or cp311 wheels,
which no single forced platform tag finds), the pinned wheel the one its own file name's tags name."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rigstack.cache import wheels_dir
from rigstack.errors import UserError


def release_wheel(dist: str, version: str) -> Path | None:
    """The wheel of dist==version from the cache, else downloaded into it; None when the index has no such release
    with a wheel for this machine. The wheel is the one pip would install here (manylinux1 for old releases, a
    cp311 build where there is no abi3 one): a cached wheel counts when its tags are among this interpreter's.

    Nothing pins this wheel's sha256 yet: the caller records and shows it (and checks a --sha256 the user gave)."""
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    def installs(path: Path) -> bool:
        try:
            return not parse_wheel_filename(path.name)[3].isdisjoint(supported)
        except InvalidWheelFilename:
            return False

    supported = set(sys_tags())
    prefix = f"{dist.replace('-', '_')}-{version}-"
    cached = sorted(path for path in wheels_dir().glob(f"{prefix}*.whl") if installs(path))
    return cached[0] if cached else pip_download(dist, version)


def _pinned_tags(wheel_name: str) -> list[str]:
    """pip's options for the pinned wheel's own tags (from its file name), so it downloads on any host."""
    from packaging.utils import parse_wheel_filename

    tag = sorted(parse_wheel_filename(wheel_name)[3], key=str)[0]
    return ["--platform", tag.platform, "--implementation", tag.interpreter[:2], "--abi", tag.abi,
            "--python-version", f"{sys.version_info[0]}{sys.version_info[1]}"]


def pip_download(dist: str, version: str, pinned: str | None = None) -> Path | None:
    """dist==version's wheel, downloaded into the cache by pip: the `pinned` wheel by its own tags, else the one
    pip's finder picks for this interpreter; None when the index has no such release (with a wheel for it)."""
    cache = wheels_dir()
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   *(_pinned_tags(pinned) if pinned else []), "--dest", tmp, f"{dist}=={version}"]
        # pip's progress bar goes to stderr with everything else for people: stdout may carry --json.
        result = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        fetched = sorted(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not fetched:
            reason = _pip_reason(result.stderr)
            if reason == "no such release":
                return None
            raise UserError(f"could not download {dist}=={version} ({reason}); with no network, put the wheel in "
                            f"{cache}/ and rerun")
        target = cache / fetched[0].name
        os.replace(fetched[0], target)
        return target


def _pip_reason(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    # pip says "(from versions: none)" both when the index is unreachable and when it has never heard of the
    # project; a reachable index lists the releases it does have.
    if any("(from versions: none)" in line for line in lines):
        return "the package index did not answer (no network?) or lists no such project"
    if any("No matching distribution" in line for line in lines):
        return "no such release"
    return lines[-1][:160] if lines else "pip failed"


def newest_release(dist: str) -> str:
    """The newest release of dist on the package index, as pip sees it (pre-releases left out)."""
    result = subprocess.run([sys.executable, "-m", "pip", "index", "versions", dist], capture_output=True, text=True)
    first = result.stdout.strip().splitlines()[:1]
    if result.returncode != 0 or not first or not first[0].startswith(f"{dist} ("):
        raise UserError(f"could not ask the package index for {dist}'s newest release "
                        f"({_pip_reason(result.stderr)}); give the release, e.g. --to 0.34.0")
    return first[0].split("(", 1)[1].rstrip(")")
