"""The `local` backend: an ipykernel subprocess on this host (`process.py`), confined with
Landlock (`landlock.py`). Not a security boundary; for a single trusted user."""
