"""Building the model request from records (the full builder comes with the context issue)."""
