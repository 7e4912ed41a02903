"""Artifact files and their metadata: the store, the cache quota, the sweep of leftovers."""
