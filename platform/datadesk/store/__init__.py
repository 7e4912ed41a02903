"""On-disk state: layout, thread logs, threads, users and sessions."""
