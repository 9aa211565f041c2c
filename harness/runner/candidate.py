"""What a ``runner`` implementation must look like, checked when it is loaded (``--impl runner=...``).

The signature, then a smoke ``run`` on a one-layer zoo model with the emulated backend; only the
interface is checked, never the values (mutants must load). ``docs/runner.md`` gives the interface."""

from __future__ import annotations

import warnings
from typing import Any

from harness.impls import check_signature, describe, require_callable, require_members, smoke_step

__all__ = ["validate_runner_factory", "fixed_capture_plan", "RUNNER_MEMBERS", "RUNNER_METHODS"]

_FACTORY = "factory(model, *, buckets, graphs, strict_discovery=False)"
# The runner interface of docs/runner.md.
RUNNER_MEMBERS = ("discovery", "buckets", "stats")
RUNNER_METHODS = ("bucket_for", "can_run", "run", "replay", "capture_plan")
# What docs/runner.md fixes of each bucket's entry in capture_plan()["graphs"]; a runner may add more.
CAPTURE_PLAN_FIXED = ("segments", "breaks")
_SMOKE_BUCKETS = (4,)
_SMOKE_LENGTHS = [3]


def validate_runner_factory(candidate: Any, spec: str, *, smoke: bool = True) -> Any:
    """Return ``candidate`` if it behaves as a runner factory, else raise
    :class:`~harness.errors.ImplementationError` saying, in one line, what is wrong."""
    from harness.batch import ForwardBatch
    from harness.graphs import GraphCapturer, get_backend
    from harness.models import ModelConfig, build_model
    from harness.oracle import process_state_kept

    require_callable(candidate, spec, f"a class or factory called as {_FACTORY} that returns a runner "
                                      "(see docs/runner.md)")
    check_signature(candidate, spec, _FACTORY, object(), buckets=_SMOKE_BUCKETS, graphs=object(),
                    strict_discovery=False)
    if not smoke:
        return candidate
    config = ModelConfig(num_layers=1)
    model = build_model("dense", seed=0, config=config)
    graphs = GraphCapturer(get_backend("emulated"))
    name = describe(candidate)
    call = f"{name}(dense model, buckets={_SMOKE_BUCKETS}, graphs=<emulated capturer>)"
    # What the smoke call leaves in the process (gc switched off, a grad mode) is put back: left there, it would
    # hide the same change made by the construction and calls the suites check (harness.oracle).
    with warnings.catch_warnings(), process_state_kept():
        warnings.simplefilter("ignore")  # a discovery warning is the suites' business
        runner = smoke_step(spec, call, lambda: candidate(model, buckets=_SMOKE_BUCKETS, graphs=graphs,
                                                          strict_discovery=False))
        require_members(runner, spec, f"the object {name}(...) returned", RUNNER_MEMBERS, callables=RUNNER_METHODS)
        batch = ForwardBatch.from_lengths(_SMOKE_LENGTHS, vocab_size=config.vocab_size, seed=0)
        smoke_step(spec, f"runner.run(one request of {_SMOKE_LENGTHS[0]} tokens)", lambda: runner.run(batch))
    return candidate


def fixed_capture_plan(plan: Any) -> dict[str, dict[str, Any]]:
    """The part of a runner's ``capture_plan()`` that the contract fixes, for goldens and exact comparisons:
    ``{"<bucket>": {"segments": int, "breaks": int}}``. docs/runner.md asks for *at least* that, so other
    top-level keys and other keys of a bucket's entry (an engine's own bookkeeping) are left out; a missing
    one is an AssertionError saying what the contract asks for."""
    graphs = plan.get("graphs") if isinstance(plan, dict) else None
    if not isinstance(graphs, dict):
        raise AssertionError(f"capture_plan() returned {plan!r}: docs/runner.md asks for at least "
                             '{"graphs": {"<bucket>": {"segments": int, "breaks": int}, ...}}')
    fixed = {}
    for bucket, entry in graphs.items():
        missing = [key for key in CAPTURE_PLAN_FIXED if not isinstance(entry, dict) or key not in entry]
        if missing:
            raise AssertionError(f"capture_plan()['graphs'][{bucket!r}] is {entry!r}, without {', '.join(missing)}: "
                                 'docs/runner.md asks for at least {"segments": int, "breaks": int} per bucket')
        fixed[str(bucket)] = {key: entry[key] for key in CAPTURE_PLAN_FIXED}
    return fixed
