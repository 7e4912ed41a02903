"""Readers of every tabular format a tool result, an upload or a paste may hold."""
