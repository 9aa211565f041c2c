"""Kernel launches per call, counted with ``torch.profiler``: reported for every candidate.

On CUDA the device kernels of a steady-state call are counted; a candidate that declares
``promised_kernel_launches`` is held to it. The eager oracle launches one gather kernel per buffer,
which checks the counter itself. On the CPU, inductor's kernels are invisible to the profiler, so
the test reports what is visible (top-level ATen ops) and checks the counter on the oracle.
"""

from __future__ import annotations

import pytest

from harness.gather import GatherCase, count_launches, eager_gather, promised_launches

pytestmark = pytest.mark.clause("launch-promise")


@pytest.mark.parametrize("with_hidden", [True, False], ids=["hidden", "no-hidden"])
def test_kernel_launches(check_gather, gather_function, implementation_under_test, device, record_property,
                         with_hidden):
    candidate_name = implementation_under_test("gather").name
    case = GatherCase(pool=256, count=64, seed=12, **({} if with_hidden else {"hidden": None}))
    inputs = case.build(device)
    gathered = 4 if with_hidden else 3
    # Compile, autotune and lazy initialisation are not steady-state launches: one checked call (the
    # candidate beside the oracle) warms both. The counted calls run bare: the profiler counts what they launch.
    check_gather.args(*inputs.args, case=case, call="warm-up")
    candidate = count_launches(lambda: gather_function(*inputs.args), device=device)
    oracle = count_launches(lambda: eager_gather(*inputs.args), device=device)
    record_property("gather_launches", f"{candidate_name}: {candidate.summary()}; eager: {oracle.summary()}; "
                                       f"kernels {dict(candidate.kernel_names)}")
    if device.type != "cuda":
        assert candidate.kernels is None and oracle.aten_ops == gathered, (
            f"on {device} the eager oracle should dispatch one aten::index per buffer ({gathered}), "
            f"the counter saw {oracle.aten_ops:g}: the launch counter is broken")
        return
    assert oracle.kernels == gathered, (
        f"the eager oracle launched {oracle.kernels:g} kernels per call ({dict(oracle.kernel_names)}), "
        f"expected one per gathered buffer ({gathered}): the launch counter is broken")
    promised = promised_launches(gather_function, with_hidden=with_hidden, spec=f"gather={candidate_name}")
    if promised is not None:
        assert candidate.kernels == promised, (
            f"{candidate_name} promises {promised} kernel launches per call "
            f"({'with' if with_hidden else 'without'} hidden states) but launched {candidate.kernels:g}: "
            f"{dict(candidate.kernel_names)}")
