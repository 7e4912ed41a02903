"""Tools the model can call. Built-ins register through the same registry MCP tools will use."""
