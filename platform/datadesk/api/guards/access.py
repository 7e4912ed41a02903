"""What a request may reach: the workspaces its user is a member of, and that user's own threads
and artifacts. Someone else's thread, artifact or workspace gets the same answer as one that does
not exist (404), so ids cannot be probed."""

from __future__ import annotations

from litestar.exceptions import NotFoundException

from datadesk.composition import Runtime
from datadesk.domain.artifacts import Artifact
from datadesk.domain.ids import check_id
from datadesk.domain.users import User
from datadesk.store.threads import Thread


def member_workspace(user: User, workspace: str | None) -> str:
    """The workspace a request names (default: the user's first), checked: a malformed id is a 400
    and a workspace the user is not a member of a 404, like one that does not exist."""
    ws = workspace or user.workspaces[0]
    check_id(ws, "workspace")
    if ws not in user.workspaces:
        raise NotFoundException(f"workspace {ws!r} not found")
    return ws


def find_thread(rt: Runtime, user: User, tid: str) -> Thread:
    """The user's thread `tid` in one of their workspaces (ThreadNotFound, a 404, otherwise)."""
    check_id(tid, "thread")
    return rt.threads.get(tid, user.id, user.workspaces)


def find_artifact(rt: Runtime, user: User, aid: str) -> tuple[Thread, Artifact]:
    """The user's artifact `aid` and the thread it belongs to (ArtifactNotFound, a 404, otherwise)."""
    check_id(aid, "artifact")
    thread, art = rt.artifacts.find(aid, user.id, user.workspaces)
    return rt.threads.get(thread.id, user.id, user.workspaces), art
