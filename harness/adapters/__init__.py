"""Adapters that point the suites at an engine's shipped code (``--impl COMPONENT=ENGINE``).

An adapter only bridges interfaces: names, error types, and the pool and stream set-up the engine's
own runner does. It never changes what the engine's code computes, and it reaches no private name
of the harness (breaks arrive through :func:`harness.graphs.receive_breaks`). Each engine is one
module; its loaders are named in the component table (:mod:`harness.components`, ``adapters``) and
import the engine only when selected, so a missing engine is one line saying what to install.
"""

__all__: list[str] = []
