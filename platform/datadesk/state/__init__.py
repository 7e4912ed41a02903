"""The interfaces between the app and where its state lives (SCALE.md section 5.2).

Each module holds the protocols of one area and its small shared types, no I/O. Two sets
implement them: the embedded one (files, file locks, FTS5 under the home: `store/`, `chat/`,
`memory/`, `offload/`, `sandbox/`) and the cluster one (`cluster/`: PostgreSQL and S3).
"""
