"""The conformance suite runs once per backend: every `ApprovalStore` must pass all of it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from core import ApprovalStore, MemoryApprovalStore

BACKENDS = ["memory"]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ApprovalStore]:
    """A fresh, empty store of each backend."""
    if request.param == "memory":
        yield MemoryApprovalStore()
    else:  # pragma: no cover - every backend in BACKENDS is handled above
        raise AssertionError(f"no fixture for backend {request.param!r}")
