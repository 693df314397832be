"""Benchmarks: scripts that print figures, run by hand (not part of the test suite)."""
