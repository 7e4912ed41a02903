"""`[sources.<name>]` in `workspace.toml`: one analyst database the model may query.

    [sources.sales]
    url = "postgresql://analyst@db.internal:5432/sales"
    password = "${env:SALES_DB_PASSWORD}"   # read from the app's environment at connect time
    description = "Orders and customers, EUR"
    schemas = ["public"]                    # what the model may see (default: all it can read)

Kinds by URL scheme: `postgresql://` (or `postgres://`), `mysql://` / `mariadb://`,
`sqlite:///<path inside the workspace>`; or `driver = "adbc_driver_<name>"` with its
`options` for any installed ADBC driver. A password is never written in the file: the URL
may not carry one, and `password` (like any option value) may only be `${env:VAR}`.

A bad entry does not stop the app: `parse_source` raises `SourceConfigError` naming the key,
and the source shows as misconfigured with that reason.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import msgspec

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_ENV = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
WAREHOUSE = "warehouse"  # the workspace's DuckDB warehouse: the default source, a reserved name
KINDS = {"postgresql": "postgresql", "postgres": "postgresql", "mysql": "mysql", "mariadb": "mysql",
         "sqlite": "sqlite"}
DIALECTS = {"postgresql": "postgres", "mysql": "mysql", "sqlite": "sqlite", "duckdb": "duckdb"}
_SECRET_KEY = re.compile(r"pass|secret|token|key|credential|auth", re.I)
MASK = "********"
_QUERY_SECRET = re.compile(r"([?&;][^=&#;\s]*(?:pass|pwd|secret|token|key|credential|auth)[^=&#;\s]*=)[^&#;\s]*", re.I)


class SourceConfigError(ValueError):
    """A bad `[sources.<name>]` entry: the message names the key and what is wrong."""


class SourceConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One `[sources.<name>]` table (see the module docstring; every key is in docs/sources-and-mcp.md)."""

    url: str = ""
    password: str = ""  # "${env:VAR}" only
    description: str = ""
    schemas: list[str] = msgspec.field(default_factory=list)  # visible schemas (empty: all)
    driver: str = ""  # generic ADBC driver module, e.g. "adbc_driver_snowflake"
    options: dict[str, str] = msgspec.field(default_factory=dict)  # driver options; values may be ${env:VAR}
    dialect: str = ""  # SQL dialect for the statement check (sqlglot name); default from the kind
    timeout_s: float = 0.0  # statement timeout in the session (0: the server's sql.timeout_s)
    max_connections: int = 4  # open sessions of this source, all users together
    max_connections_per_user: int = 2  # sessions one user may hold (users never share one)
    catalog_ttl_s: float = 300.0  # how long a described catalogue is reused
    allow_write_privileges: bool = False  # accept a login that may write (every query is still read-only)
    allow_functions: list[str] = msgspec.field(default_factory=list)  # user-defined functions a query may call


class ParsedSource(msgspec.Struct, frozen=True):
    """A validated source: its kind, dialect and the URL parts (no secret values resolved)."""

    name: str
    kind: str  # postgresql | mysql | sqlite | adbc
    dialect: str
    config: SourceConfig
    host: str = ""
    port: int | None = None
    user: str = ""
    database: str = ""
    path: str = ""  # sqlite: relative to the workspace directory
    query: str = ""  # URL query string (driver parameters), kept as written

    def display_url(self) -> str:
        """The URL without any secret (it never carries one; options are masked elsewhere)."""
        if self.kind == "sqlite":
            return f"sqlite:///{self.path}"
        if self.kind == "adbc":
            return mask_text(self.config.url, self) if self.config.url else ""
        return self.config.url


def env_refs(value: str) -> list[str]:
    return _ENV.findall(value)


def resolve_env(value: str, key: str) -> str:
    """`value` with each `${env:VAR}` replaced from the environment; a missing one names the key."""
    def sub(m: re.Match[str]) -> str:
        got = os.environ.get(m.group(1))
        if got is None:
            raise SourceConfigError(f"{key}: the environment variable {m.group(1)} is not set")
        return got
    return _ENV.sub(sub, value)


def secret_values(src: ParsedSource) -> list[str]:
    """The resolved secrets of `src` (for scrubbing messages); missing variables are skipped."""
    out = []
    candidates = [src.config.password] + [v for k, v in src.config.options.items() if env_refs(v)
                                          or _SECRET_KEY.search(k)]
    for value in candidates:
        for var in env_refs(value):
            got = os.environ.get(var)
            if got:
                out.extend({got, quote(got, safe="")})
        if value and not env_refs(value):
            out.append(value)
    return [s for s in out if len(s) >= 3]


def mask_text(text: str, src: ParsedSource | None) -> str:
    """`text` with every secret of `src` and any `user:password@` in a URL replaced by a mask."""
    text = re.sub(r"(://[^/:@\s]+):[^@\s/]+@", r"\1:" + MASK + "@", text)
    text = _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, text)  # ?password=...&token=... in a URL
    for secret in secret_values(src) if src is not None else []:
        text = text.replace(secret, MASK)
    return text


def masked_config(src_name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """A raw `[sources.<name>]` table as an admin may see it: passwords and secret options masked."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "password":
            out[key] = value if isinstance(value, str) and _ENV.fullmatch(value) else MASK
        elif key == "options" and isinstance(value, dict):
            out[key] = {k: (v if isinstance(v, str) and _ENV.fullmatch(v) else MASK) if _SECRET_KEY.search(k)
                        else v for k, v in value.items()}
        elif key == "url" and isinstance(value, str):
            out[key] = mask_text(value, None)
        else:
            out[key] = value
    return out


def _check_secret_field(key: str, value: str) -> None:
    if value and not _ENV.fullmatch(value):
        raise SourceConfigError(f"{key}: write the secret as \"${{env:VARIABLE}}\" (read from the app's "
                                "environment); it may not be written in workspace.toml")


def _parse_url(name: str, cfg: SourceConfig) -> dict[str, Any]:
    key = f"sources.{name}.url"
    parts = urlsplit(cfg.url)
    kind = KINDS.get(parts.scheme.lower())
    if kind is None:
        raise SourceConfigError(f"{key}: unknown kind {parts.scheme!r}; use postgresql://, mysql://, "
                                "mariadb://, sqlite:/// or driver = \"adbc_driver_<name>\"")
    if kind == "sqlite":
        rel = unquote(cfg.url.split("://", 1)[1])
        if not rel.startswith("/") or rel.startswith("//") or not rel.strip("/"):
            raise SourceConfigError(f"{key}: write sqlite:///<path inside the workspace>, e.g. "
                                    "sqlite:///data/shop.sqlite")
        rel = rel[1:].split("?", 1)[0]
        if ".." in rel.split("/"):
            raise SourceConfigError(f"{key}: the SQLite file must be inside the workspace (no '..')")
        return {"kind": kind, "path": rel}
    if parts.password is not None:
        raise SourceConfigError(f"{key}: the URL may not carry a password; set password = "
                                "\"${env:VARIABLE}\" instead")
    if not parts.hostname:
        raise SourceConfigError(f"{key}: no host in the URL")
    try:
        port = parts.port
    except ValueError:
        raise SourceConfigError(f"{key}: the port is not a number") from None
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise SourceConfigError(f"{key}: name the database in the URL path (…/<database>)")
    return {"kind": kind, "host": parts.hostname, "port": port, "user": unquote(parts.username or ""),
            "database": database, "query": parts.query}


def parse_source(name: str, raw: object) -> ParsedSource:
    """Validate one `[sources.<name>]` table; SourceConfigError names the key and the problem."""
    if not NAME.fullmatch(name) or name == WAREHOUSE:
        raise SourceConfigError(f"sources.{name}: a source name is a plain identifier of 1-32 characters "
                                f"(letters, digits, _), not {WAREHOUSE!r}")
    if not isinstance(raw, dict):
        raise SourceConfigError(f"sources.{name}: must be a table ([sources.{name}])")
    try:
        cfg = msgspec.convert(raw, SourceConfig)
    except msgspec.ValidationError as exc:
        raise SourceConfigError(f"sources.{name}: {exc}") from None
    _check_secret_field(f"sources.{name}.password", cfg.password)
    for opt, value in cfg.options.items():
        if _SECRET_KEY.search(opt):
            _check_secret_field(f"sources.{name}.options.{opt}", value)
    if cfg.max_connections < 1 or cfg.max_connections_per_user < 1:
        raise SourceConfigError(f"sources.{name}: max_connections and max_connections_per_user must be >= 1")
    if cfg.timeout_s < 0 or cfg.catalog_ttl_s < 0:
        raise SourceConfigError(f"sources.{name}: timeout_s and catalog_ttl_s may not be negative")
    for fn in cfg.allow_functions:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]{0,62}(\.[A-Za-z_][A-Za-z0-9_$]{0,62})?", fn):
            raise SourceConfigError(f"sources.{name}.allow_functions: {fn!r} is not a function name "
                                    "(name or schema.name, letters, digits, _ and $)")
    for schema in cfg.schemas:
        if not schema or len(schema) > 128:
            raise SourceConfigError(f"sources.{name}.schemas: an empty or overlong schema name")
    if cfg.driver:
        if not re.fullmatch(r"adbc_driver_[a-z0-9_]+", cfg.driver):
            raise SourceConfigError(f"sources.{name}.driver: an ADBC driver module such as "
                                    f"\"adbc_driver_snowflake\", got {cfg.driver!r}")
        if "://" in cfg.url and re.search(r"://[^/@]*:[^/@]*@", cfg.url):
            raise SourceConfigError(f"sources.{name}.url: the URL may not carry a password; use an option "
                                    "with \"${env:VARIABLE}\"")
        if cfg.dialect:
            dialect = _sqlglot_dialect(name, cfg.dialect)
        else:  # the driver's name when sqlglot knows it (snowflake, bigquery, ...), else generic SQL
            guess = cfg.driver.removeprefix("adbc_driver_").split("_")[0]
            dialect = DIALECTS.get(guess, guess) if _known_dialect(DIALECTS.get(guess, guess)) else ""
        return ParsedSource(name=name, kind="adbc", dialect=dialect, config=cfg)
    if not cfg.url:
        raise SourceConfigError(f"sources.{name}: set url (postgresql://, mysql://, sqlite:///...) or driver")
    parts = _parse_url(name, cfg)
    dialect = cfg.dialect or DIALECTS[parts["kind"]]
    return ParsedSource(name=name, dialect=_sqlglot_dialect(name, dialect), config=cfg, **parts)


def _known_dialect(dialect: str) -> bool:
    from sqlglot.dialects.dialect import Dialect

    try:
        Dialect.get_or_raise(dialect)
    except ValueError:
        return False
    return True


def _sqlglot_dialect(name: str, dialect: str) -> str:
    if not _known_dialect(dialect):
        raise SourceConfigError(f"sources.{name}.dialect: unknown SQL dialect {dialect!r} (set dialect = "
                                "\"postgres\", \"mysql\", \"snowflake\", \"bigquery\", ...)") from None
    return dialect
