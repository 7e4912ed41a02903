"""CSV and TSV."""
