"""One member of a zip (a wheel), read at its offset and inflated by ISA-L.

A first apply inflates about half a gigabyte of the GPU wheel (0.3 GB of compiled objects, 0.12 GB of text) on a
box that is often two cores; zipfile inflates with zlib, ISA-L in about half the CPU time. zipfile still reads the
central directory (names, offsets, sizes, CRCs); only the inflating moves here. Each call reads through the handle
it is given, so each thread passes its own (a ZipFile is not thread-safe, and opening one per member re-reads the
6,000-entry directory)."""

from __future__ import annotations

import os
import struct
import zipfile
from typing import BinaryIO

from isal import isal_zlib

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, 22 bytes this reader skips, name and extra field lengths
_SIGNATURE = b"PK\x03\x04"
_ENCRYPTED = 0x1


def member_bytes(handle: BinaryIO, info: zipfile.ZipInfo) -> bytes:
    """The member's bytes, checked against the CRC-32 and size the directory records (zipfile.BadZipFile if not).
    Members stored or deflated are read here; any other method (never seen in a wheel) goes through zipfile."""
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) or info.flag_bits & _ENCRYPTED:
        with zipfile.ZipFile(handle) as archive:
            return archive.read(info)
    handle.seek(info.header_offset)
    signature, name_length, extra_length = _LOCAL_HEADER.unpack(handle.read(_LOCAL_HEADER.size))
    if signature != _SIGNATURE:
        raise zipfile.BadZipFile(f"{info.filename}: no local header at offset {info.header_offset}")
    handle.seek(name_length + extra_length, os.SEEK_CUR)
    raw = handle.read(info.compress_size)
    try:
        data = isal_zlib.decompress(raw, wbits=-15) if info.compress_type == zipfile.ZIP_DEFLATED else raw
    except isal_zlib.error as error:
        raise zipfile.BadZipFile(f"{info.filename}: {error}") from None
    if len(data) != info.file_size or isal_zlib.crc32(data) != info.CRC:
        raise zipfile.BadZipFile(f"{info.filename}: size or CRC-32 does not match the zip's directory")
    return data
