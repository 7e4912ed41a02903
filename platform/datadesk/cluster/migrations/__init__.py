"""Numbered plain-SQL schema migrations (`NNNN_<area>.sql`), applied once each, in order, by
`cluster.database.Database.migrate` at start. Plain SQL, not Alembic: the app has no ORM models
to autogenerate from, and each file reads as exactly what runs."""
