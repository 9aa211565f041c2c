"""Known-bad implementations. Each reproduces one real bug class; the suites must kill every one."""
