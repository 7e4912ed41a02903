"""The interfaces between the app and where its state lives (SCALE.md section 5.2).

Each module holds the protocols of one area and its small shared types, no I/O, and imports
nothing of the app above `domain/`, so any package may type against it (the sandbox too).
Two sets implement them, chosen once by the composition root: the embedded one (files, file
locks, FTS5 under the home: `store/`, `chat/`, `memory/`, `offload/`, `sandbox/`) and the
cluster one (`cluster/`: PostgreSQL and an S3-compatible object store).
"""
