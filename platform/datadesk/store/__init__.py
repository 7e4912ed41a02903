"""State: the interfaces every set implements (`interfaces/`), and the embedded set's files
under the home (layout, thread logs, threads, users and sessions, search, locks)."""
