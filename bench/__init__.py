"""Benchmarks: modules that print figures, run by hand as ``python -m bench.<name>`` (not
part of the test suite). They import the installed packages only, never ``tests``."""
