"""Model access: the OpenAI-compatible client, the scripted model, token counting."""
