"""Python reprs of tables (`str(cursor.fetchall())` ...), never with `eval`."""
