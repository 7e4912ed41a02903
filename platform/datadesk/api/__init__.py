"""The HTTP API (the only package that imports litestar)."""
