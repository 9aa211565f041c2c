"""Hazard amplifiers: make latent CUDA hazards fail deterministically instead of by chance.

A use of freed memory, a read of rows nobody wrote, or a stream that is not joined gives right values on CUDA
as long as nothing else lands on that memory or the scheduler happens to finish the work in time. Each amplifier
here removes the luck: :func:`poison_free_memory` fills every block the caching allocator holds free (the graphs'
pools included) with NaN bytes, and :func:`widened_races` delays the work every side stream is handed. Both are on
in the suites on CUDA (``--hazard-amplifiers off`` turns them off) and are no-ops elsewhere; each has a positive
control in ``suites/graphs/test_hazard_amplifiers.py``. :func:`uninitialised_memory_poisoned` fills every fresh
allocation with NaN on any device; the pad-row suite runs under it (positive control in
``suites/runner/test_pad_rows.py``). :func:`amplifiers_paused` holds them off while calls
overlap in threads, where another thread's capture may be writing the memory they would fill."""

from harness.hazards._config import AMPLIFIERS_VARIABLE, amplifiers_enabled, amplifiers_paused
from harness.hazards._poison import POISON_BYTE, FreeBlock, PoisonReport, free_blocks, poison_free_memory
from harness.hazards._races import SPIN_CYCLES, widened_races
from harness.hazards._uninitialised import uninitialised_memory_poisoned

__all__ = ["AMPLIFIERS_VARIABLE", "POISON_BYTE", "FreeBlock", "PoisonReport", "SPIN_CYCLES", "amplifiers_enabled",
           "amplifiers_paused", "free_blocks", "poison_free_memory", "uninitialised_memory_poisoned", "widened_races"]
