"""Loaded by every Python process of a run of vLLM's own tests (this folder is on their PYTHONPATH): each
/dev/shm/vllm_*.mmap file a process creates is noted in the file RIGSTACK_SHM_LOG names, so that the run removes
exactly its own leftovers afterwards. Upstream's KV-offload tests leave some behind (a child they SIGKILL never
cleans up), and the names carry random engine ids, so nothing else tells a run's files from another run's."""

from __future__ import annotations

import os

SHM_LOG = "RIGSTACK_SHM_LOG"
PREFIX, SUFFIX = "/dev/shm/vllm_", ".mmap"


def _noting(real_open):  # wraps os.open, keeping its signature
    log = os.environ[SHM_LOG]

    def open_and_note(path, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        name = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
        # O_CREAT | O_EXCL succeeded: this process made the file (a joiner's plain open is not noted).
        if flags & os.O_CREAT and flags & os.O_EXCL and dir_fd is None and name.startswith(PREFIX) \
                and name.endswith(SUFFIX):
            with open(log, "a") as handle:  # one short appended line: whole even when processes write at once
                handle.write(name + "\n")
        return fd

    return open_and_note


if os.environ.get(SHM_LOG):
    os.open = _noting(os.open)
