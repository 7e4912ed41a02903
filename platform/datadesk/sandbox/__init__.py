"""Kernel sessions: backends, registry, reaper. Imports nothing above it."""
