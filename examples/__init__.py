"""Worked examples of using tool-dispatcher (not part of the installed packages)."""
