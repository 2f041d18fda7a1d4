"""A zip member read at its offset and inflated by ISA-L is the member zipfile reads; a damaged one is refused."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from rigstack.zipmember import member_bytes

MEMBERS = {
    "vllm/__init__.py": b"import os\n" * 5000,  # deflated
    "vllm/empty.py": b"",
    "vllm/random.bin": os.urandom(200_000),  # deflate gains nothing; still deflated
}


def _wheel(path: Path, compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in MEMBERS.items():
            archive.writestr(name, data)
        # A member with an extra field in its local header, which the reader must step over.
        info = zipfile.ZipInfo("vllm/extra.py")
        info.extra = b"\xfe\xca\x04\x00abcd"
        info.compress_type = compression
        archive.writestr(info, b"EXTRA = 1\n")
    return path


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED, zipfile.ZIP_BZIP2])
def test_every_member_reads_as_zipfile_reads_it(tmp_path: Path, compression: int) -> None:
    wheel = _wheel(tmp_path / "w.whl", compression)
    with zipfile.ZipFile(wheel) as archive, open(wheel, "rb") as handle:
        for info in archive.infolist():
            assert member_bytes(handle, info) == archive.read(info)


def test_a_flipped_byte_is_a_bad_zip_not_wrong_bytes(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "w.whl")
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo("vllm/random.bin")
    data = bytearray(wheel.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + 1000] ^= 0xFF  # inside the deflated stream
    wheel.write_bytes(bytes(data))
    with open(wheel, "rb") as handle, pytest.raises(zipfile.BadZipFile, match="random.bin"):
        member_bytes(handle, info)


def test_a_directory_pointing_at_no_local_header_is_a_bad_zip(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "w.whl")
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo("vllm/__init__.py")
    info.header_offset += 7
    with open(wheel, "rb") as handle, pytest.raises(zipfile.BadZipFile, match="no local header"):
        member_bytes(handle, info)
