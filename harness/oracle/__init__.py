"""Eager is the oracle for everything a caller can observe: one checker every suite calls implementations through.

Safe to use: :class:`Checker` (``.call``, ``.construct``, ``.released`` for what a call keeps alive, ``.steady``
for what a long run grows), :func:`check_call`, :func:`checks_stop` (a failed check raises at once, also in
a conformance run, where checks record and go on), :data:`CALLING_MODES` with :func:`calling_mode`,
:func:`caller_contexts` (the settings a caller can set, drawn by hypothesis; ``Checker.call`` draws one itself in
every hypothesis example; for graphs and the runner, :func:`example_caller_context` holds one from the example's first
capture to its end, and :func:`context_key` keys the suites' caches of runners by it), :func:`process_state`
(every setting and mode of the process a call must leave as it found them), :func:`process_state_kept` (around the
harness's own smoke calls), :func:`footprint` (the tensors and device bytes the process holds, after collecting),
and :data:`ALLOWED`,
the table of differences a component's contract permits (extend it with a reason, never to make a failure pass).
The process state compared and the contexts drawn come from walking the installed torch (``_globals``).
:mod:`harness.oracle.concurrency` makes calls from several threads overlap for certain, for the thread tests."""

from harness.oracle._allowed import ALLOWED, allowed
from harness.oracle._checker import CALLING_MODES, Checker, calling_mode, check_call
from harness.oracle._contexts import caller_contexts, context_key, example_caller_context
from harness.oracle._recording import checks_stop
from harness.oracle._resources import Footprint, footprint
from harness.oracle._state import process_state, process_state_kept

__all__ = ["ALLOWED", "allowed", "CALLING_MODES", "calling_mode", "caller_contexts", "checks_stop", "context_key",
           "example_caller_context", "Checker", "check_call", "Footprint", "footprint", "process_state",
           "process_state_kept"]
