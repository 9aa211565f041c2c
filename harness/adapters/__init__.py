"""Adapters that put an engine's shipped code under the suites (``--impl COMPONENT=ENGINE``).

An adapter bridges names, error types and set-up only, never what the engine computes, and reaches
no private harness name. One module per engine; its loaders are named in the component table's
``adapters`` field and import the engine only when selected."""

__all__: list[str] = []
