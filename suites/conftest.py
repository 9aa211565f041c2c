"""What every suite shares beyond the harness's pytest plugin: goldens in the harness's format."""

from __future__ import annotations

import pytest


@pytest.fixture
def snapshot(snapshot):
    """Syrupy's snapshot, writing readable JSON goldens under golden/ (tensors compared within tolerance)."""
    from harness.golden import GoldenExtension

    return snapshot.use_extension(GoldenExtension)
