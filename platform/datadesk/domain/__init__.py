"""Plain records shared by every layer (no I/O, no framework imports)."""
