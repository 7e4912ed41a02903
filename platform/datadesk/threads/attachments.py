"""What the analyst brings into a thread besides words: uploaded files, and tables pasted into a
message too large to send as text. Both become artifacts (DESIGN section 6: "uploads become
artifacts the same way"), and the model reads them in the same preview form as an offloaded
result. An upload is recorded in the log as a user record; a pasted table replaces the message
text the turn sends.

Ingesting runs in a worker thread that stops when the request is cancelled (the client went
away): a cancelled or failed upload leaves no artifact and no temp file
(`offload.uploads.ingest_upload_async`). Rows and bytes written go to an optional `progress`
callback. Temp files a crash left behind are swept by `offload.artifacts.tempfiles`.

A workbook becomes one artifact per sheet (the note lists them, and the sheets skipped). A
CSV/TSV upload can be read again with the analyst's options (`reimport`: delimiter, decimal
separator, header row, encoding), which replaces its artifact's data in place.

An upload holds the thread's turn slot as a task of its own, so Stop, clear and delete cancel it
like a turn (`TurnRegistry.cancel`); its work is bounded by the `offload.upload_max_*` limits
(`UploadLimits`). A pasted table takes the slot too while it is written: refused (409) while a
turn runs, it leaves no artifact.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

from datadesk.chat.turns import TurnRegistry
from datadesk.domain.artifacts import ArtifactOrigin
from datadesk.domain.records import Record, UserRecordMeta, record_meta
from datadesk.domain.users import User
from datadesk.llm.tokens import count_tokens
from datadesk.offload import preview
from datadesk.offload.readers.limits import UploadLimits
from datadesk.offload.pipeline import OffloadCapability, OffloadPipeline
from datadesk.offload.artifacts.quota import ArtifactQuota
from datadesk.offload.readers import TEXT_TABLES, detect_text
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.csv.dialect import ReadChoices
from datadesk.offload.uploads import IMAGES, Upload, UploadError, ingest_upload_async, reimport_upload_async
from datadesk.settings import OffloadSettings
from datadesk.store.admission import MemoryGuard, QuerySlots
from datadesk.store.diskspace import DiskRoom
from datadesk.store.files import not_saved
from datadesk.store.tempnames import temp_prefix
from datadesk.store.threads import Thread

T = TypeVar("T")

MAX_PASTE_CHARS = 4 * 1024 * 1024  # a longer message is never taken for a pasted table
MAX_SHEET_PREVIEWS = 8  # a workbook's sheets previewed in the note; the rest are listed
PASTE_NAME = "pasted-table"

# Writes the file's bytes to the open descriptor (closing it) and returns the file's name.
Receive = Callable[[int], Awaitable[str]]


class MessageTooLong(ValueError):
    """A message too large for the model that is not a table it could read as a file."""


class UploadStopped(UploadError):
    """The upload was cancelled by Stop, clear or delete of its thread; nothing was kept."""


def upload_limits(s: OffloadSettings) -> UploadLimits:
    return UploadLimits(unpacked_bytes=s.upload_max_unpacked_bytes, zip_ratio=s.upload_max_zip_ratio,
                        rows=s.upload_max_rows, columns=s.upload_max_columns,
                        cell_bytes=s.upload_max_cell_bytes, text_bytes=s.upload_max_text_bytes,
                        seconds=s.upload_max_seconds,
                        memory_bytes=s.upload_max_memory_bytes)


def staging_file(thread: Thread, prefix: str) -> tuple[int, str]:
    """A temp file in the thread's artifacts folder, so the finished artifact is a rename away."""
    thread.artifacts_dir.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(prefix=temp_prefix(prefix.strip(".-")), suffix=".tmp", dir=thread.artifacts_dir)


class Attachments:
    """Turns uploads and pasted tables into artifacts and tells the model about them.

    `capability(user, workspace)` says whether that user's model can read artifact files in that
    workspace (the python tool, a healthy sandbox); when it cannot, the note says so.
    """

    def __init__(self, offload: OffloadPipeline, quota: ArtifactQuota, turns: TurnRegistry,
                 settings: OffloadSettings, max_message_tokens: int,
                 capability: Callable[[User, str], OffloadCapability],
                 memory: MemoryGuard | None = None, slots: QuerySlots | None = None,
                 disk: DiskRoom | None = None) -> None:
        self.offload = offload
        self.disk = disk  # below store.min_free_mb no upload or pasted table starts (DiskLow -> 507)
        self.memory = memory  # near the app's memory ceiling no upload starts (Busy -> 503)
        self.slots = slots  # conversions per user and in the app (limits.uploads*)
        self.quota = quota
        self.turns = turns
        self.settings = settings
        self.max_message_tokens = max_message_tokens
        self.capability = capability

    async def upload(self, thread: Thread, user: User, receive: Receive,
                     progress: Callable[..., None] | None = None) -> Upload:
        """Receive one file into the thread (409 while a turn runs on it), make it artifacts (one
        per sheet of a workbook) within the quotas, and record it for the model. UploadError names
        what is wrong with it. `progress(rows=, bytes=)` is called while the file is converted. It
        runs as the turn's task: cancelling the thread's turn stops it (UploadStopped), nothing kept."""
        return await self._as_turn(thread, user, lambda turn_id: self._upload(thread, user, receive, progress, turn_id),
                                   "the upload")

    async def reimport(self, thread: Thread, user: User, aid: str, choices: ReadChoices) -> Upload:
        """Read the kept original of the CSV/TSV upload `aid` again with `choices` and replace the
        artifact's data in place (same id and sandbox path); the model is told in a user record.
        As an upload: the thread's turn slot (409 while a turn runs), Stop cancels it, and any
        error leaves the artifact as it was (UploadError naming why)."""
        return await self._as_turn(thread, user, lambda turn_id: self._reimport(thread, user, aid, choices, turn_id),
                                   "the re-import")

    def _fence(self, thread: Thread) -> int | None:
        """The fence of the upload's turn in this process (its record is refused once another
        host took the thread over)."""
        turn = self.turns.get(thread.id)
        return turn.fence if turn is not None else None

    async def _as_turn(self, thread: Thread, user: User, work: Callable[[str], Awaitable[Upload]],
                       what: str) -> Upload:
        if self.memory is not None:
            self.memory.check_admit("upload")
        if self.disk is not None:
            self.disk.check(what)
        turn = self.turns.reserve(thread.id, user.id)
        try:
            task = turn.task = asyncio.ensure_future(work(turn.turn_id))
            try:
                done = await task
                thread.end_turn()  # store.fsync = "turn": an acknowledged upload is on the disk, as a turn is
                return done
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if task.cancelled() and (me is None or not me.cancelling()):
                    raise UploadStopped(f"{what} was stopped (Stop, or the thread was cleared or "
                                        "deleted); nothing was kept") from None
                raise
        finally:
            self.turns.release(turn)

    async def _upload(self, thread: Thread, user: User, receive: Receive,
                      progress: Callable[..., None] | None, turn_id: str) -> Upload:
        tmp_path: str | None = None
        try:
            fd, tmp_path = staging_file(thread, ".upload-")
            filename = await receive(fd)
            upload = await self._converting(user, f"the upload {filename}",
                                            lambda: self._ingest(thread, user, Path(tmp_path), filename, progress))
            tmp_path = None  # consumed by the ingest
            text = self.note(user, thread, upload, filename)
            arts = upload.artifacts
            thread.append(lambda seq: Record(
                seq=seq, role="user", ts=time.time(), turn_id=turn_id, content=text,
                meta=record_meta(UserRecordMeta(kind="upload", artifact=arts[0].id, filename=filename,
                                                image=arts[0].format in IMAGES,
                                                artifacts=[a.id for a in arts] if len(arts) > 1 else None,
                                                skipped_sheets=[f"{n} ({w})" for n, w in upload.skipped] or None)),
            ), thread.epoch, fence=self._fence(thread))
            return upload
        finally:
            if tmp_path and os.path.exists(tmp_path):
                os.unlink(tmp_path)

    async def _converting(self, user: User, what: str, work: Callable[[], Awaitable[T]]) -> T:
        """`work` (a conversion) under one of the user's upload slots (limits.uploads*); a disk that
        fills up while it writes is told as `what` not saved (store/files.py `not_saved`)."""
        slot = None
        try:
            slot = await self.slots.acquire(user.id, "upload") if self.slots is not None else None
            return await work()
        except OSError as exc:
            error = not_saved(exc, what)
            if error is None:
                raise
            raise error from None
        finally:
            if slot is not None:
                slot.release()

    async def _reimport(self, thread: Thread, user: User, aid: str, choices: ReadChoices, turn_id: str) -> Upload:
        art = self.offload.store.load(thread, aid)  # ArtifactNotFound: 404
        if art.kind != "upload":
            raise UploadError(f"artifact {aid} is not an upload: only an uploaded CSV or TSV can be re-imported")
        table = await self._converting(user, f"the re-import of {art.name}", lambda: reimport_upload_async(
            self.offload, thread, art, choices, upload_limits(self.settings)))
        self.quota.after_create(table[0])
        upload = Upload([table])
        filename = art.origin.filename or aid
        said = ", ".join(f"{k} {v!r}" for k, v in choices.as_dict().items()) or "the sniffed options"
        text = (f"[The user re-imported the upload {filename} with {said}: artifact {aid} was REPLACED in place "
                "(same id and sandbox path). Earlier previews, results and data loaded from it are out of "
                "date; read it again.]\n" + self._previews(user, thread, upload))
        thread.append(lambda seq: Record(
            seq=seq, role="user", ts=time.time(), turn_id=turn_id, content=text,
            meta=record_meta(UserRecordMeta(kind="upload", artifact=aid, filename=filename, reimport=True)),
        ), thread.epoch, fence=self._fence(thread))
        return upload

    async def message_text(self, thread: Thread, user: User, text: str) -> str:
        """The message as the model will read it: as typed when it fits; a pasted table too large
        for the model (any shape the readers read from text: CSV, JSON, Markdown, HTML, a Python
        repr ...) becomes an artifact and the model gets its preview; any other
        text too large is refused (MessageTooLong, naming the limit)."""
        limit = self.max_message_tokens
        # tokens are >= 1 per 8 chars in practice: count only when it can matter
        if len(text) <= 8 * limit and (len(text) <= limit or count_tokens(text) <= limit):
            return text
        if len(text) <= MAX_PASTE_CHARS and detect_text(text) in TEXT_TABLES:
            if self.disk is not None:
                self.disk.check("the pasted table")
            # the thread's slot first: while a turn runs the message is refused (409), no artifact
            turn = self.turns.reserve(thread.id, user.id)
            try:
                fd, tmp = staging_file(thread, ".paste-")
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(text)
                upload = await self._ingest(thread, user, Path(tmp), PASTE_NAME)
            except (UploadError, TabularParseError):
                pass  # not a table after all: refused below like any long text
            else:
                return ("[The user pasted a table too large to show here; it was saved as a file.]\n"
                        + self.note(user, thread, upload, PASTE_NAME))
            finally:
                self.turns.release(turn)
        raise MessageTooLong(
            f"the message is too long for the model (about {count_tokens(text[:400_000]):,}+ tokens; limit "
            f"{limit:,}). Upload large data as a file instead, or shorten the message.")

    async def _ingest(self, thread: Thread, user: User, tmp: Path, filename: str,
                      progress: Callable[..., None] | None = None) -> Upload:
        """The file at `tmp` (consumed, also when cancelled) as artifacts of the thread, older
        cache data making room (never one of these)."""
        origin = ArtifactOrigin(source="upload", user=user.id, thread=thread.id, workspace=thread.workspace,
                                filename=filename)
        upload = await ingest_upload_async(self.offload, thread, tmp, filename, origin, progress,
                                           upload_limits(self.settings))
        self.quota.after_create(*upload.artifacts)
        return upload

    def note(self, user: User, thread: Thread, upload: Upload, filename: str) -> str:
        """The upload in the same preview form as an offloaded result (what the model reads): each
        artifact's preview, a workbook's sheets listed (and the ones skipped)."""
        first = upload.artifacts[0]
        if first.format in IMAGES:
            return (f"[The user uploaded an image: {filename} (artifact {first.id}, "
                    f"{preview.human_bytes(first.bytes)})]")
        sheets = [a for a in upload.artifacts if a.origin.sheet is not None]
        head = f"[The user uploaded a file: {filename}]"
        if sheets or upload.skipped:
            listed = ", ".join(f"{a.origin.sheet!r} -> {a.id}" for a in sheets)
            skipped = "; ".join(f"{name!r} ({why})" for name, why in upload.skipped)
            head = (f"[The user uploaded a file: {filename}: a workbook; each sheet with rows is its own artifact: "
                    f"{listed}" + (f". Skipped sheets: {skipped}" if skipped else "") + "]")
        return head + "\n" + self._previews(user, thread, upload)

    def _previews(self, user: User, thread: Thread, upload: Upload) -> str:
        s = self.settings
        cap = self.capability(user, thread.workspace)
        tables = upload.tables
        shown = tables[:MAX_SHEET_PREVIEWS]
        budget = max(s.max_tokens // max(1, len(shown)), 600)
        parts = [preview.render_table_artifact(art, schema, head, f"upload {art.name or art.id!r}", count_tokens,
                                               budget, s.preview_rows, s.preview_cell_chars, s.max_columns)
                 for art, head, schema in shown]
        if len(tables) > len(shown):
            parts.append("Further sheets (previews not shown; read them with the python tool): " + "; ".join(
                f"{a.origin.sheet!r}: artifact {a.id}, {a.rows:,} rows x {a.columns} columns, {a.sandbox_path}"
                for a, _, _ in tables[len(shown):]))
        text = "\n".join(parts)
        if not cap.can_offload:
            text += (f"\nNOTE: the python tool is not available ({cap.reason}), so the full file cannot be "
                     "read in this chat; only the preview above is visible. Say so if asked for statistics.")
        return text
