"""Any installed ADBC driver, by module name: `driver = "adbc_driver_snowflake"` plus its `options`.

The driver manager loads the package's shared library (`<module>._driver_path()`); `url` (if
set) becomes the `uri` option, every other option is passed as written (values may be
`${env:VAR}`). Read-only: the standard `adbc.connection.readonly` option is requested, and
each query's transaction is rolled back; a driver that does not support the option relies on
the statement check alone (the source's status says so; give such a source a read-only role).
Stop and the deadline call the driver's cancel where it has one.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Iterator

import pyarrow as pa

from datadesk.sources.config import ParsedSource, SourceConfigError, resolve_env
from datadesk.sources.session import SourceDown

READ_ONLY_OPTION = "adbc.connection.readonly"


def driver_path(src: ParsedSource) -> str:
    try:
        module = importlib.import_module(src.config.driver)
    except ImportError:
        raise SourceConfigError(f"sources.{src.name}.driver: the ADBC driver {src.config.driver!r} is not "
                                f"installed (pip install {src.config.driver.replace('_', '-')})") from None
    find = getattr(module, "_driver_path", None)
    if find is None:
        raise SourceConfigError(f"sources.{src.name}.driver: {src.config.driver!r} is not an ADBC driver package")
    return str(find())


class CursorSession:
    """What every ADBC DB-API session shares: the running cursor (so another thread can cancel
    it), the cancel, and closing the connection. `_con` is set by the subclass."""

    _con: Any

    def __init__(self) -> None:
        self.broken = False
        self._lock = threading.Lock()
        self._cur: Any = None

    def _running(self, cur: Any) -> None:
        with self._lock:
            self._cur = cur

    def _take_cursor(self) -> Any:
        with self._lock:
            cur, self._cur = self._cur, None
        return cur

    def interrupt(self) -> None:
        with self._lock:
            cur = self._cur
        if cur is not None:
            try:
                cur.adbc_cancel()
            except Exception:
                self.broken = True  # no cancel: the connection is dropped when the stream closes

    def close(self) -> None:
        cur = self._take_cursor()
        try:
            if cur is not None:
                cur.close()
        finally:
            self._con.close()


class ADBCSession(CursorSession):
    """One connection through the ADBC driver manager."""

    def __init__(self, src: ParsedSource) -> None:
        import adbc_driver_manager.dbapi as dbapi

        super().__init__()
        kwargs = {k: resolve_env(v, f"sources.{src.name}.options.{k}") for k, v in src.config.options.items()}
        if src.config.url:
            kwargs.setdefault("uri", src.config.url)
        path = driver_path(src)
        try:
            self._con = dbapi.connect(driver=path, db_kwargs=kwargs, autocommit=False)
        except dbapi.Error as exc:
            raise SourceDown(f"cannot connect to source {src.name!r} ({src.config.driver}): {exc}") from None
        try:
            self._con.adbc_connection.set_options(**{READ_ONLY_OPTION: "true"})
            self.read_only_session = True
        except dbapi.Error:
            self.read_only_session = False

    def execute(self, sql: str, batch_size: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
        cur = self._con.cursor()
        self._running(cur)
        cur.execute(sql)
        reader = cur.fetch_record_batch()
        return reader.schema, iter(reader), [str(f.type) for f in reader.schema]

    def end(self) -> None:
        cur = self._take_cursor()
        if cur is not None:
            cur.close()
        self._con.rollback()

    def objects(self, schemas: list[str]) -> list[tuple]:
        """The catalogue from the driver's get_objects, as rows like the other catalogues."""
        table = self._con.adbc_get_objects(depth="all").read_all().to_pylist()
        out = []
        for catalog in table:
            for schema in catalog.get("catalog_db_schemas") or []:
                sname = schema.get("db_schema_name") or ""
                if schemas and sname not in schemas:
                    continue
                for t in schema.get("db_schema_tables") or []:
                    kind = "view" if "VIEW" in str(t.get("table_type", "")).upper() else "table"
                    for col in t.get("table_columns") or []:
                        out.append((sname, t["table_name"], kind, None, None, col["column_name"],
                                    col.get("xdbc_type_name") or "", col.get("remarks")))
        return out
