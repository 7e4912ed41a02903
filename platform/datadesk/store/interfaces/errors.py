"""Errors any set may raise, importable without the cluster packages."""


class ClusterUnavailable(RuntimeError):
    """The cluster database (or another shared service) could not be reached or used; the
    message names it, without credentials."""
