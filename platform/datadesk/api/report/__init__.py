"""The report page's API (`controller`) and its JSON and self-contained HTML (`page`)."""
