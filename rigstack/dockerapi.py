"""The docker daemon connection: one place that turns docker SDK failures into user errors with advice."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import docker
import docker.errors

from rigstack.errors import UserError


# The SDK's timeout is per read: a DOCKER_HOST that drips its answer a byte at a time held `image verify` forever.
CONNECT_DEADLINE_S = 15.0


def connect() -> docker.DockerClient:
    try:
        return _within(CONNECT_DEADLINE_S, _connected)
    except docker.errors.DockerException as error:
        raise UserError(f"no docker daemon is reachable ({str(error).splitlines()[0][:120]}); start one with "
                        "`dockerd > /var/log/dockerd.log 2>&1 &` (or `systemctl start docker`)") from None


def _connected() -> docker.DockerClient:
    client = docker.from_env(timeout=600)  # asks the daemon its API version first
    client.ping()
    return client


def _within(seconds: float, call: Callable[[], docker.DockerClient]) -> docker.DockerClient:
    """call(), whole, within `seconds`; one still reading then is left to the exiting process."""
    outcome: list[docker.DockerClient | BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:  # handed to the caller's thread
            outcome.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if not outcome:
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        raise UserError(f"the docker daemon at {where} did not answer within {seconds:g} s; check DOCKER_HOST and "
                        "that dockerd is not hung (`docker info`)")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def local_image(client: docker.DockerClient, ref: str, fix: str | None = None):  # noqa: ANN201 - an Image
    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        fix = fix or f"pull it (`docker pull {ref}`) or load/import it (`docker load -i FILE.tar`)"
        raise UserError(f"image {ref} is not present locally; {fix}") from None


def remove_container(name: str) -> None:
    """Force-remove a container by name; gone already is fine."""
    try:
        connect().containers.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass


@contextmanager
def package_archive(ref: str, path: str) -> Iterator[io.BufferedIOBase]:
    """A tar stream of `path` inside image `ref`, read from a created (never started) container."""
    client = connect()
    image = local_image(client, ref)
    container = client.containers.create(image, command=["true"], entrypoint=[])
    try:
        try:
            chunks, _ = container.get_archive(path)
        except docker.errors.NotFound:
            raise UserError(f"image {ref} has no {path}; set VLLM_IMAGE_PACKAGE_PATH in versions.env") from None
        yield io.BufferedReader(_ChunkReader(chunks), buffer_size=1 << 20)
    finally:
        container.remove(force=True)


class _ChunkReader(io.RawIOBase):
    """A file object over the SDK's chunk generator, so tarfile can stream it without holding it all."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def split_tag(tag: str) -> tuple[str, str]:
    """(repository, tag) of an image reference; "latest" when it names none ("host:5000/repo" has no tag)."""
    repository, _, name = tag.rpartition(":")
    if not repository or "/" in name:
        return tag, "latest"
    return repository, name
