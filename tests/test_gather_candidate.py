"""Loading gather candidates: the signature check and the promised-launch declaration."""

from __future__ import annotations

import pytest
import torch

from harness import impls
from harness.errors import ImplementationError
from harness.gather import compiled_gather, eager_gather, promised_launches, validate_gather


def _four(indices, topk_p_buf, topk_index_buf, output_tokens_buf):
    return None


def _six_required(indices, a, b, c, d, e):
    return None


def _keyword_only(indices, a, b, c, *, hidden_states_buf):
    return None


def _variadic(*args):
    return None


def test_reference_mutants_and_oracle_are_registered():
    assert impls.load("gather", "reference").obj is compiled_gather
    assert impls.load("gather", "eager").obj is eager_gather
    mutants = impls.mutants("gather")
    assert len(mutants) >= 10 and all(m.bug for m in mutants), "every mutant must say which bug it reproduces"


@pytest.mark.parametrize("candidate", [_four, _six_required, _keyword_only], ids=lambda f: f.__name__)
def test_wrong_signature_is_a_clear_error(candidate):
    with pytest.raises(ImplementationError, match=r"cannot be called as gather\(indices, topk_p_buf.*5 positional"):
        validate_gather(candidate, "gather=pkg.mod:f")


def test_not_callable_is_a_clear_error():
    with pytest.raises(ImplementationError, match="expected a callable gather"):
        validate_gather(42, "gather=pkg.mod:f")


def test_compiled_and_variadic_callables_are_accepted():
    assert validate_gather(torch.compile(eager_gather, dynamic=True), "gather=x:y") is not None
    assert validate_gather(_variadic, "gather=x:y") is _variadic


def test_external_spec_with_wrong_signature_fails_at_load():
    with pytest.raises(ImplementationError, match="gather=harness.gather.relay:SpecExtrasRelay.resolve"):
        impls.load("gather", "harness.gather.relay:SpecExtrasRelay.resolve")


def test_external_spec_loads():
    assert impls.load("gather", "harness.gather:eager_gather").obj is eager_gather


@pytest.mark.parametrize("promise, with_hidden, without_hidden", [
    (None, None, None), (2, 2, 2), ({"with_hidden": 3, "without_hidden": 1}, 3, 1)])
def test_promised_launches(promise, with_hidden, without_hidden):
    def candidate(indices, a, b, c, d):
        return None

    candidate.promised_kernel_launches = promise
    validate_gather(candidate, "gather=x:y")
    assert promised_launches(candidate, with_hidden=True) == with_hidden
    assert promised_launches(candidate, with_hidden=False) == without_hidden


@pytest.mark.parametrize("promise", [-1, 2.5, True, "3", {"with_hidden": 3}, {"with_hidden": 3, "without_hidden": -2}])
def test_malformed_promise_is_a_clear_error(promise):
    def candidate(indices, a, b, c, d):
        return None

    candidate.promised_kernel_launches = promise
    with pytest.raises(ImplementationError, match="promised_kernel_launches"):
        validate_gather(candidate, "gather=x:y")
