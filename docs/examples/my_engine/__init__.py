"""The engine of the docs' examples: stand-ins for engine code, and the adapters the docs show.

``docs/*.md`` include the adapters from here verbatim, and ``tests/test_docs_examples.py`` runs each
against its component's suite (``PYTHONPATH=docs/examples pytest suites/runner --impl
runner=my_engine.adapters:make_runner``), so a documented example cannot fail its own suite.
"""
