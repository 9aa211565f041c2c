"""Adapters that put an engine's shipped code under the suites (``--impl COMPONENT=ENGINE``).

An adapter bridges names, error types and set-up only, never what the engine computes, and reaches
no private harness name. One module per engine; its loaders are named in the component table's
``adapters`` field and import the engine only when selected. Where the engine documents a narrower contract
than a clause's, the module declares it in ``DOCUMENTED_AWAY`` (:class:`harness.conformance.clauses.DocumentedAway`)
instead of making up for it, and conformance reports the clause as ``documented away``."""

__all__: list[str] = []
