"""HTML tables (`<table>`), as some MCP servers answer: read by the standard library's
`html.parser` (`stdlib_engine`), a tokenizer that never runs a script or fetches anything."""
