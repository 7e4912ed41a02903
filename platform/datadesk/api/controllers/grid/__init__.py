"""The grid's endpoints beyond pages (issue 32): column profiles, group-by, chart this view."""
