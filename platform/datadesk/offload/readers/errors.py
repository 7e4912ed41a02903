"""The errors every reader raises: what could not be read as a table, and why."""

from __future__ import annotations


class TabularParseError(ValueError):
    """Raw data could not be read as a table; the message says where and why."""


class LimitExceeded(TabularParseError):
    """The file passed one of the upload limits; the message names the limit (HTTP 413)."""
