"""The version-counter-bypassing writes the suites make between calls (harness.writes)."""

from __future__ import annotations

import pytest
import torch

from harness.writes import BYPASSING_WRITES, HOST_ONLY_WRITES, bypassing_writes_for


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("route", sorted(BYPASSING_WRITES))
def test_each_route_writes_the_values_and_leaves_the_counter(route, dtype):
    tensor = torch.zeros(3, 4, dtype=dtype)
    values = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(dtype)
    version = tensor._version
    BYPASSING_WRITES[route](tensor, values)
    assert torch.equal(tensor, values), f"{route} wrote {tensor}, not {values}"
    assert tensor._version == version, f"{route} moved the version counter from {version} to {tensor._version}"


def test_device_routes_leave_out_the_host_only_ones():
    assert set(bypassing_writes_for(torch.device("cpu"))) == set(BYPASSING_WRITES)
    assert set(bypassing_writes_for(torch.device("cuda", 0))) == set(BYPASSING_WRITES) - HOST_ONLY_WRITES
