"""The result grid: pages of an artifact's full data, and CSV downloads."""
