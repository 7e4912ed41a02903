"""What can go wrong with one query on any source (the warehouse or a configured database).

    SQLError                 a query the model or user can fix: bad SQL, a missing table or
     |                       warehouse, the engine's own message (the source named)
     +-- SQLRefused          not one read statement (COPY, ATTACH, SET, a write, two at once),
     |                       or a schema the source does not show
     +-- SQLTimeout          ran past its deadline and was interrupted
     +-- SQLLimit            needed more memory or temp space than the limits allow, or the
     |                       app's memory ceiling stopped it
     +-- SQLCancelled        the call was cancelled (Stop, the turn ended)
     +-- SourceBusy          no session of the source is free for this user (session.py)
     +-- SourceDown          the source cannot be reached or dropped the connection (session.py)
         +-- SourceRefused   the login may write and the config does not accept it (privileges.py)

The SQL tool turns every one of them into a tool error whose text is the message.
"""

from __future__ import annotations

MESSAGE_CHARS = 500


class SQLError(Exception):
    """A query the model or user can fix: bad SQL, missing warehouse, engine error."""


class SQLRefused(SQLError):
    """A statement that is not a read (COPY, ATTACH, SET, PRAGMA, CREATE, ...) or several at once."""


class SQLTimeout(SQLError):
    """The statement ran past the timeout and was interrupted."""


class SQLLimit(SQLError):
    """The statement needed more memory or temp space than the limits allow and was stopped."""


class SQLCancelled(SQLError):
    """The call was cancelled (Stop, the turn ended) and the statement was interrupted."""


def short_message(exc: BaseException) -> str:
    """An engine's message, cut to MESSAGE_CHARS."""
    text = str(exc).strip()
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def timeout_message(timeout_s: float) -> str:
    return f"query exceeded {timeout_s:g} s; narrow it or add a LIMIT"
