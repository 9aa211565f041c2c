"""Mutants of the ``graphs`` component (filled in with the suites)."""
