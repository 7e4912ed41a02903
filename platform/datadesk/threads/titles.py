"""The title an untitled chat takes by itself. Its first question names it (chat/loop.py, and
the web client); a chat started with an upload is named after the file (its name, no folder)
when the upload lands, so it is never left as "New chat" (POST .../uploads)."""

from __future__ import annotations

from pathlib import PurePath

UNTITLED = "New chat"
MAX_AUTO_TITLE_CHARS = 80


def upload_title(current: str, filename: str | None) -> str | None:
    """The title for a chat whose title is `current` after an upload of `filename`: the file's
    name (no folder) when the chat is still untitled, else None (a chat keeps its title)."""
    if current != UNTITLED or not filename:
        return None
    name = " ".join(PurePath(str(filename).replace("\\", "/")).name.split())
    return name[:MAX_AUTO_TITLE_CHARS] or None
