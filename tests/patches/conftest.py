"""The patch tests import whatever `vllm` is importable (patched or pristine); their fixtures (tiny_model,
vllm_server) come from tests/fixtures_server.py. Here: the marker for tests that must pass on both."""

from __future__ import annotations

import pytest

GUARD = "upstream_guard"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{GUARD}: checks upstream behaviour the patch must keep; passes on the "
                                       "pristine package too (every other patch test must fail there)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Carried into the JUnit XML, where rigstack.patchtests reads which tests are guards.
    for item in items:
        if item.get_closest_marker(GUARD):
            item.user_properties.append((GUARD, "1"))
