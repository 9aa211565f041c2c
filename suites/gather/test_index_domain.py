"""Index values at and past the edges of [-pool, pool), run in child processes.

An unchecked kernel can crash or poison the CUDA context on these, so the candidate runs them in
fresh interpreters (:mod:`harness.gather.probe`), which report what it did on each case: ``correct``,
``raised``, ``wrong data`` or ``crashed``. Negative indices in range must give the oracle's result
(they wrap like Python indexing); indices outside the range must raise. One test runs every case
(one child process where nothing crashes) and reports them all.
"""

from __future__ import annotations

import pytest
import torch

from harness.compare import format_context
from harness.gather import GatherCase
from harness.gather.probe import ProbeCase, probe

pytestmark = pytest.mark.clause("index-domain")

_POOL = 17
_CASES = {
    # name: (index values, index dtype, required outcome). One buffer set (hidden states included)
    # for all cases, so a compiled candidate compiles one graph per index dtype in the child.
    "negative-wrap-int64": ((-17, -1, 0, 16, -5, 3, -17, 8, -2), torch.int64, "correct"),
    "negative-wrap-int32": ((-1, -16, 4, -17, 0), torch.int32, "correct"),
    "index-equal-to-pool": ((0, 17, 3), torch.int64, "raised"),
    "below-minus-pool": ((2, -18), torch.int64, "raised"),
    "int64-beyond-2**32": ((1, 2**32 + 3), torch.int64, "raised"),
}


@pytest.mark.long_running
@pytest.mark.subprocess
def test_index_domain_in_child_processes(implementation_under_test, device, failure_context):
    candidate_name = implementation_under_test("gather").name
    cases = {
        name: GatherCase(pool=_POOL, count=len(values), seed=11, index_dtype=index_dtype, index_values=values)
        for name, (values, index_dtype, _) in _CASES.items()
    }
    required = {name: spec[2] for name, spec in _CASES.items()}
    results = probe(candidate_name, [ProbeCase(name, case, required[name] == "correct")
                                       for name, case in cases.items()], device=str(device))
    wrong = [f"{name}: required '{required[name]}', the candidate gave {results[name]}; "
             f"indices {list(_CASES[name][0])} ({_CASES[name][1]}), pool {_POOL}"
             for name in cases if results[name].outcome != required[name]]
    context = failure_context(seed=11, pool=_POOL)
    assert not wrong, (f"{candidate_name} mishandles the index domain:\n  " + "\n  ".join(wrong)
                       + format_context(context))
