"""The patch tests import whatever `vllm` is importable (patched or pristine); their fixtures (tiny_model,
vllm_server) come from tests/fixtures_server.py. Here: a torchvision stand-in and the marker for tests that must
pass on both."""

from __future__ import annotations

import pytest


def _stub_missing_torchvision() -> None:
    """glm5next imports GLM-4V's image processor, whose module imports
    torchvision at the top; PyPI has no CPU torchvision for the test venv's
    torch. Images are never processed here, so an empty module satisfies the
    import (transformers has already cached torchvision as unavailable)."""
    import importlib.util
    import sys
    import types

    from transformers.utils import import_utils

    if (
        "torchvision" in sys.modules
        or import_utils.is_torchvision_available()
        or importlib.util.find_spec("torchvision")
    ):
        return
    for name in (
        "torchvision",
        "torchvision.transforms",
        "torchvision.transforms.v2",
        "torchvision.transforms.v2.functional",
    ):
        sys.modules[name] = types.ModuleType(name)


# Before any patch test imports glm5next.
_stub_missing_torchvision()

GUARD = "upstream_guard"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{GUARD}: checks upstream behaviour the patch must keep; passes on the "
                                       "pristine package too (every other patch test must fail there)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Carried into the JUnit XML, where rigstack.patchtests reads which tests are guards.
    for item in items:
        if item.get_closest_marker(GUARD):
            item.user_properties.append((GUARD, "1"))
