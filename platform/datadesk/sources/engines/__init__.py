"""The drivers of the configured databases: one `session.Session` per connection, read-only in
the database session itself. postgres (ADBC), mysql (asyncmy, MySQL and MariaDB), sqlite
(the standard library), adbc (any installed ADBC driver); rowbatches turns DB-API rows into
Arrow batches for the drivers that give rows. The warehouse's DuckDB is not one of them: it
runs in the app process, one locked-down connection per query (../warehouse.py).
"""
