"""An empty torchvision where none is installed; a pytest plugin (`-p torchvision_stub`) for vLLM's own tests, and
called by rigstack's patch tests' conftest.

glm5next imports GLM-4V's image processor, and the MiniMax-M3 model its own processor, whose modules import
torchvision at the top; there is no CPU torchvision for the test venv's torch. Images are never processed in these
tests, so modules that satisfy the imports are enough: a name imported from them is a placeholder that refuses to be
used (transformers has already cached torchvision as unavailable, so nothing takes it for the real one)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
import types

MODULES = ("torchvision", "torchvision.transforms", "torchvision.transforms.v2", "torchvision.transforms.v2.functional")


class _Missing:
    """What `from torchvision.x import Name` gets: usable in annotations, an error on any use."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> object:
        raise ModuleNotFoundError(f"torchvision is not installed ({self._name}.{attribute} was used); "
                                  "rigstack stubbed it only so that modules importing it load")

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.__getattr__("__call__")


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def missing(attribute: str) -> _Missing:
        if attribute.startswith("__"):  # import machinery probes (__path__, __file__): absent, as they should be
            raise AttributeError(attribute)
        return _Missing(f"{name}.{attribute}")

    module.__getattr__ = missing  # type: ignore[method-assign]
    return module


def stub_missing_torchvision() -> None:
    """Install the stand-in modules unless a torchvision is importable (or already imported)."""
    from transformers.utils import import_utils

    if ("torchvision" in sys.modules or import_utils.is_torchvision_available()
            or importlib.util.find_spec("torchvision")):
        return
    for name in MODULES:
        sys.modules[name] = _module(name)
    for parent, child in itertools.pairwise(MODULES):  # `import torchvision.transforms` then reaches it as an attribute
        setattr(sys.modules[parent], child.rpartition(".")[2], sys.modules[child])


def pytest_configure() -> None:
    # As a plugin: before any test module is collected.
    stub_missing_torchvision()
