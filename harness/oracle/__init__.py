"""Eager is the oracle for everything a caller can observe: one checker every suite calls implementations through.

Safe to use: :class:`Checker` (``.call`` and ``.construct``), :func:`check_call`, :data:`CALLING_MODES` with
:func:`calling_mode`, :func:`process_state_kept` (around the harness's own smoke calls), and :data:`ALLOWED`, the
table of differences a component's contract permits (extend it with a reason, never to make a failure pass).
:mod:`harness.oracle.concurrency` makes calls from several threads overlap for certain, for the thread tests."""

from harness.oracle._allowed import ALLOWED, allowed
from harness.oracle._checker import CALLING_MODES, Checker, calling_mode, check_call
from harness.oracle._state import process_state_kept

__all__ = ["ALLOWED", "allowed", "CALLING_MODES", "calling_mode", "Checker", "check_call", "process_state_kept"]
