"""Excel workbooks (.xlsx)."""
