"""The server's log lines: plain text for a terminal, or one JSON object a line
(`server.log_format = "json"`) for a log collector, with the turn and thread a line belongs to
(telemetry.py's context variables, set in each turn's task).

Credentials never reach either form: `RedactSecrets` sits on the same handler and cleans each
record before it is formatted.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys

from datadesk.telemetry import THREAD_ID, TURN_ID

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


class TurnFields(logging.Filter):
    """Puts the running turn's ids on each record (`turn_id`, `thread_id`; None outside a turn)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "turn_id", None) is None:
            record.turn_id = TURN_ID.get()
        if getattr(record, "thread_id", None) is None:
            record.thread_id = THREAD_ID.get()
        return True


class JsonLines(logging.Formatter):
    """One JSON object a line: ts (UTC, ISO 8601), level, logger, message, pid, the turn's ids
    when the line belongs to a turn, and the traceback as `exc`."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(), "pid": record.process,
        }
        for name in ("turn_id", "thread_id"):
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(log_format: str = "text", level: int = logging.INFO) -> None:
    """The root's one handler on stderr in `log_format` ("text" | "json"), with the turn's ids and
    the secret filter; uvicorn's loggers write through it (no handlers of their own)."""
    from datadesk.api.guards.auth import RedactSecrets

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(TurnFields())
    handler.addFilter(RedactSecrets())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    if log_format == "json":
        for name in UVICORN_LOGGERS:  # through the root: JSON too
            logger = logging.getLogger(name)
            logger.handlers.clear()
            logger.propagate = True


def uvicorn_log_config(log_format: str) -> dict | None:
    """uvicorn's `log_config`: its own colourful text handlers, or None with JSON lines (then it
    configures nothing and its loggers reach the root's JSON handler)."""
    if log_format == "json":
        return None
    from uvicorn.config import LOGGING_CONFIG

    return LOGGING_CONFIG
