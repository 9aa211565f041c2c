"""A checkout's root pytest configuration: only what a checkout needs.

Options, fixtures, hypothesis profiles and the run report are the harness's pytest plugin
(:mod:`harness.pytest_plugin`, a ``pytest11`` entry point of the installed package). It is named here
too, under the entry point's name (so it is loaded once), for runs with plugin autoloading switched off
(``PYTEST_DISABLE_PLUGIN_AUTOLOAD``).
"""

pytest_plugins = ["harness.pytest_plugin"]
