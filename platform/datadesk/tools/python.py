"""The `python` tool: code runs in the thread's warm kernel (sandbox/), reading /data.

What the model gets back (an explicit return contract: never offloaded):
notices (fresh kernel, expired artifacts), stdout/stderr capped head+tail
(the full text saved as an artifact), the last expression, the error with
ANSI codes stripped and the traceback trimmed, and references to the images,
charts and files the code produced. Images are saved as PNG artifacts (with the
title and dark-theme variant the kernel's house style sends) and shown in the
chat; Vega-Lite charts are saved as `vega-lite` artifacts (tools/charts.py) and
shown as interactive charts; files written under /outputs become downloadable
artifacts.
"""

from __future__ import annotations

import asyncio
import mimetypes
import re
import time
from pathlib import Path
from typing import Annotated, Callable

import msgspec

from datadesk.domain.artifacts import Artifact, ArtifactOrigin
from datadesk.domain.records import OutputFile, ToolRecordMeta
from datadesk.offload.artifacts.quota import ArtifactQuota, QuotaExceeded
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.offload.artifacts.store import write_artifact_file
from datadesk.sandbox.base import ExecutionResult, ImageExtras, SandboxError
from datadesk.sandbox.execution import strip_ansi, trim_traceback
from datadesk.sandbox.files import read_regular
from datadesk.sandbox.registry import KernelRegistry
from datadesk.sandbox.sessions import ExecutionReport
from datadesk.settings import Settings
from datadesk.tools.arguments import ToolArguments
from datadesk.tools.charts import save_charts
from datadesk.tools.figures import saved_copies
from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry, ToolResult, ToolSpec
from datadesk.tools.requery import RequeryService

TOOL_NAME = "python"
MAX_CODE_CHARS = 100_000
_DATA_REF = re.compile(r"/data/([A-Za-z0-9_-]{1,64})\.(?:parquet|txt|png|jpg|gif|webp)")

DESCRIPTION = (
    "Run Python code in this thread's Jupyter kernel (pandas, numpy, pyarrow, duckdb, matplotlib; "
    "the docker kernel image also has scipy, statsmodels, scikit-learn, seaborn, altair, openpyxl "
    "and tabulate for df.to_markdown()). "
    "Variables persist between calls while the kernel is warm. Offloaded results and uploads are "
    "files under /data (read-only), e.g. pd.read_parquet('/data/<artifact>.parquet') or "
    "duckdb.sql(\"SELECT ... FROM '/data/<artifact>.parquet'\"). Compute statistics over the full "
    "file, never from a preview. Write files for the user to /outputs (they become downloads); "
    "charts shown with plt.show() appear in the chat. No network access. "
    "Output is cut to head and tail when long. "
    "Charts: prefer an interactive Vega-Lite chart (altair, e.g. `alt.Chart(df).mark_line().encode("
    "x='day:T', y='sales:Q', color='region:N', tooltip=[...]).properties(title='...')` as the cell's "
    "last expression, or display({'application/vnd.vegalite.v5+json': spec}, raw=True)) when the user "
    "explores: many points, values to read on hover, series to toggle, zoom. Its data travels inline "
    "(about 1 MB at most, altair stops at 5,000 rows): aggregate first. Use matplotlib for static "
    "figures meant for a report or a file (house style: thousands separators, legend outside, a "
    "dark-theme copy made for you); give every chart a title."
)


class RunPython(ToolArguments):
    """Arguments of `python`."""

    code: Annotated[str, msgspec.Meta(description="Python code to run in the kernel")]
    timeout_s: Annotated[float, msgspec.Meta(description="optional shorter time limit in seconds")] | None = None

    hints = {"code": "`code` must be a non-empty string of Python code",
             "timeout_s": "`timeout_s` must be a number of seconds"}


def _cap(text: str, head: int, tail: int) -> str:
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n… [{len(text) - head - tail:,} chars cut] …\n{text[-tail:]}"


class LiveOutput:
    """What a running cell prints, to the tool card as `tool.progress` events: the new text at most
    every `EVERY_S` (each event capped, the call capped in total), an elapsed-only event when the
    cell is silent for `QUIET_S`, and what the sandbox does (interrupting, restarting) at once."""

    EVERY_S = 0.25
    QUIET_S = 1.0
    EVENT_CHARS = 4_000
    CALL_CHARS = 200_000

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx
        self.pending: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.sent_chars = 0
        self.last_sent = time.monotonic()
        self.capped = False

    def output(self, stream: str, text: str) -> None:
        self.pending["stderr" if stream == "stderr" else "stdout"].append(text)
        if time.monotonic() - self.last_sent >= self.EVERY_S:
            self.flush()

    def status(self, message: str) -> None:
        self.flush()
        self._send(message=message)

    def flush(self) -> None:
        fields: dict[str, str] = {}
        for stream, parts in self.pending.items():
            text = "".join(parts)
            parts.clear()
            room = min(self.EVENT_CHARS, self.CALL_CHARS - self.sent_chars)
            if not text or room <= 0:
                self.capped = self.capped or bool(text)
                continue
            if len(text) > room:  # the newest text matters most in a live view
                text = f"… [{len(text) - room:,} chars not shown live]\n" + text[-room:]
            self.sent_chars += len(text)
            fields[stream] = text
        if fields:
            self._send(**fields)

    def _send(self, **fields: str) -> None:
        self.last_sent = time.monotonic()
        self.ctx.report(**fields)

    async def tick(self) -> None:
        """Until cancelled: flush what waits, or say the cell still runs (elapsed time)."""
        while True:
            await asyncio.sleep(self.EVERY_S)
            if any(self.pending.values()):
                self.flush()
            elif time.monotonic() - self.last_sent >= self.QUIET_S:
                self._send()


class PythonTool:
    def __init__(self, settings: Settings, kernels: KernelRegistry, store: ArtifactStore,
                 quota: ArtifactQuota, requery: RequeryService,
                 auto_requery: Callable[[str], bool] | None = None) -> None:
        self.settings = settings
        # per workspace (workspace.toml `auto_requery`), else the server setting
        self.auto_requery = auto_requery or (lambda ws: settings.offload.auto_requery)
        self.kernels = kernels
        self.store = store
        self.quota = quota
        self.requery = requery

    async def __call__(self, args: RunPython, ctx: ToolContext) -> ToolResult:
        code = args.code
        if not code.strip():
            raise ToolError(RunPython.hints["code"])
        if len(code) > MAX_CODE_CHARS:
            raise ToolError(f"code is too long ({len(code):,} chars; limit {MAX_CODE_CHARS:,})")
        refs = sorted(set(_DATA_REF.findall(code)))
        problems = await self.requery.ensure_available(refs, ctx, auto=self.auto_requery(ctx.workspace))
        if refs:
            self.store.touch(ctx.thread, refs)  # named by code = used: keeps it in the cache
        timeout = args.timeout_s
        timeout = min(timeout, self.settings.sandbox.exec_timeout_s) if timeout is not None and timeout > 0 \
            else self.settings.sandbox.exec_timeout_s
        # the thread's files as the kernel gets them: links to a local folder (the cluster set
        # fills it from the object store first), or presigned URLs for a kernel without a volume
        files = self.store.kernel_handoff(ctx.thread, self.settings.storage.presign_ttl_s)
        live = LiveOutput(ctx)
        ticker = asyncio.create_task(live.tick())
        try:
            ex = await self.kernels.execute((ctx.workspace, ctx.user, ctx.thread.id), code, timeout,
                                            files=files, on_output=live.output, on_status=live.status)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        finally:
            ticker.cancel()
            live.flush()
        produced: list[Artifact] = []
        lines: list[str] = [*problems, *ex.notices]
        # save-then-show: a displayed figure that is a PNG the code saved is shown once, as the file
        file_extras = await self._shown_files(ex)
        lines += self._body(ex.result, ctx, produced)
        lines += self._outputs(ex, ctx, produced, file_extras)  # none when the kernel died
        images = [a.id for a in produced if a.format == "png" and a.kind == "deliverable" and not a.variant_of]
        dark = {a.id: a.dark_variant for a in produced if a.id in images and a.dark_variant}
        charts = [a.id for a in produced if a.format == "vega-lite"]
        meta = ToolRecordMeta(status=ex.result.status, duration_ms=round(ex.result.duration_ms, 1),
                              artifacts=[OutputFile.of(a) for a in produced] or None, images=images or None,
                              dark_images=dark or None, charts=charts or None)
        return ToolResult(content="\n".join(line for line in lines if line) or "(no output)",
                          is_error=ex.result.status != "ok", meta=meta)

    def _origin(self, ctx: ToolContext, filename: str | None = None) -> ArtifactOrigin:
        return ctx.origin("python", filename=filename)

    def _save(self, ctx: ToolContext, data: bytes, ext: str, kind: str, media: str,
              filename: str | None, **fields: str | None) -> Artifact:
        """A new artifact of `data`; `fields` set on it before it is saved (format, title, ...)."""
        if kind == "deliverable":
            self.quota.check_deliverable(ctx.user, len(data))
        art = write_artifact_file(ctx.thread.artifacts_dir, data, ext, kind, media, self._origin(ctx, filename))
        for name, value in fields.items():
            setattr(art, name, value)
        self.store.save(ctx.thread, art, ctx.epoch)
        return art

    async def _shown_files(self, ex: ExecutionReport) -> dict[str, ImageExtras]:
        """Save-then-show: drop each displayed figure that is the picture of a PNG the code saved
        under /outputs (the file is shown instead); the file gets the figure's title and
        dark-theme variant: {file's relpath: what came with the figure}."""
        files = [f for f in ex.outputs if f.relpath.lower().endswith(".png")]
        r = ex.result
        if not files or not r.images:
            return {}
        copies = await asyncio.to_thread(saved_copies, r.images, [f.data for f in files])
        extras = [*r.image_extras, *[ImageExtras()] * (len(r.images) - len(r.image_extras))]
        kept = [n for n in range(len(r.images)) if n not in copies]
        r.images[:], r.image_extras[:] = [r.images[n] for n in kept], [extras[n] for n in kept]
        return {files[k].relpath: extras[n] for n, k in copies.items()}

    def _save_figure(self, ctx: ToolContext, png: bytes, extras: ImageExtras, produced: list[Artifact],
                     filename: str | None = None) -> Artifact:
        """Save a figure's PNG with its title and dark-theme variant (an artifact of its own,
        dropped first when the quota has no room for both); QuotaExceeded or OSError when the
        figure itself cannot be saved."""
        try:
            dark = self._save(ctx, extras.dark, "png", "deliverable", "image/png", None,
                              title=extras.title) if extras.dark else None
        except (OSError, QuotaExceeded):
            dark = None  # the figure itself matters more: it is tried alone
        try:
            art = self._save(ctx, png, "png", "deliverable", "image/png", filename, title=extras.title,
                             dark_variant=dark.id if dark else None)
        except BaseException:
            if dark is not None:
                self.store.discard(ctx.thread, dark)
            raise
        if dark is not None:
            dark.variant_of = art.id
            self.store.save(ctx.thread, dark, ctx.epoch)
            produced.append(dark)
        produced.append(art)
        return art

    def _figure(self, ctx: ToolContext, png: bytes, extras: ImageExtras, produced: list[Artifact]) -> str:
        """Save a displayed figure (and its dark-theme variant): the line for the model."""
        try:
            art = self._save_figure(ctx, png, extras, produced)
        except (OSError, QuotaExceeded) as exc:
            return f"an image was produced but not saved: {exc}"
        named = f" \"{extras.title}\"" if extras.title else ""
        return f"image: artifact {art.id}{named} ({len(png):,} bytes PNG), shown to the user in the chat"

    def _body(self, r: ExecutionResult, ctx: ToolContext, produced: list[Artifact]) -> list[str]:
        s = self.settings.sandbox
        out: list[str] = []
        status = {"ok": "ok", "error": "error", "timeout": "TIMEOUT: stopped after the time limit",
                  "died": "the kernel DIED"}[r.status]
        out.append(f"status: {status} ({r.duration_ms / 1000:.2f} s)")
        if r.note:
            out.append(r.note)
        caps = {"stdout": (s.output_head_chars, s.output_tail_chars),
                "stderr": (s.output_head_chars // 2, s.output_tail_chars // 2),
                "result": (s.output_head_chars, s.output_tail_chars)}
        texts = {"stdout": strip_ansi(r.stdout), "stderr": strip_ansi(r.stderr),
                 "result": strip_ansi(r.result) if r.result is not None else None}
        refs = self._save_full(r, texts, caps, ctx, produced)
        for name, text in texts.items():
            if text or (name == "result" and text is not None):
                out.append(name + refs.get(name, "") + ":\n" + _cap(text, *caps[name]))
        if r.error is not None:
            tb = "\n".join(trim_traceback(r.error.traceback))
            out.append(f"error: {r.error.ename}: {strip_ansi(r.error.evalue)}" + (f"\n{tb}" if tb else ""))
        extras = [*r.image_extras, *[ImageExtras()] * (len(r.images) - len(r.image_extras))]
        for png, more in zip(r.images, extras):
            out.append(self._figure(ctx, png, more, produced))
        charts, chart_lines = save_charts(r.charts, lambda data, ext, media, fmt, title: self._save(
            ctx, data, ext, "deliverable", media, None, format=fmt, title=title))
        produced += charts
        out += chart_lines
        return out

    def _save_full(self, r: ExecutionResult, texts: dict[str, str | None], caps: dict[str, tuple[int, int]],
                   ctx: ToolContext, produced: list[Artifact]) -> dict[str, str]:
        """Whatever the model gets cut is saved in full as a text artifact: the stream output
        (stdout and stderr as printed, the sandbox's file when it cut them itself), or the text
        of the last expression; returns the reference to add after each part's name."""
        cut = {n for n, t in texts.items() if t is not None and len(t) > sum(caps[n])}
        wanted: list[tuple[tuple[str, ...], str, str]] = []  # (parts, filename, label)
        if r.output_truncated or cut & {"stdout", "stderr"}:
            streams = tuple(n for n in ("stdout", "stderr") if texts[n])
            wanted.append((streams, "output.txt", f"{r.output_chars:,} chars"))
        if "result" in cut:
            wanted.append((("result",), "result.txt", f"{len(texts['result'] or ''):,} chars"))
        refs: dict[str, str] = {}
        for parts, filename, size in wanted:
            try:
                if parts != ("result",) and r.output_truncated and r.stdout_file is not None:
                    data = read_regular(r.stdout_file, 64 << 20)
                else:
                    data = "".join(texts[n] or "" for n in parts).encode("utf-8", "replace")
                art = self._save(ctx, data, "txt", "result", "text/plain; charset=utf-8", filename)
                produced.append(art)
                ref = f" (full output: {size} in {art.sandbox_path})"
            except (OSError, QuotaExceeded):
                ref = f" (output was {size}; the full text could not be saved)"
            for n in parts:
                refs[n] = ref
        return refs

    def _outputs(self, ex: ExecutionReport, ctx: ToolContext, produced: list[Artifact],
                 shown: dict[str, ImageExtras]) -> list[str]:
        """Register the new or changed regular files the execution wrote under /outputs (read by
        the registry while it still held the kernel) as downloadable artifacts; a PNG the code
        also showed gets the shown figure's title and dark-theme variant (`shown`)."""
        lines = list(ex.output_problems)
        for f in ex.outputs:
            name = f.relpath
            ext = Path(name).suffix.lstrip(".").lower()
            if not re.fullmatch(r"[a-z0-9]{1,8}", ext):
                ext = "bin"
            media = mimetypes.guess_type(name)[0] or "application/octet-stream"
            try:
                if name in shown:
                    art = self._save_figure(ctx, f.data, shown[name], produced, name)
                else:
                    art = self._save(ctx, f.data, ext, "deliverable", media, name)
                    produced.append(art)
            except (OSError, QuotaExceeded) as exc:
                lines.append(f"/outputs/{name} was not saved: {exc}")
                continue
            lines.append(f"file: /outputs/{name} saved as artifact {art.id} ({art.bytes:,} bytes), "
                         "downloadable by the user")
        return lines


def register_python_tool(registry: ToolRegistry, tool: PythonTool) -> None:
    registry.register(
        ToolSpec(
            name=TOOL_NAME,
            description=DESCRIPTION,
            parameters=RunPython.schema(),
            permission="code_execution",
            offloadable=False,
            read_only=False,
            # the execution's own deadline, then the interrupt and maybe a restart, must fit
            time_limit_s=tool.kernels.call_limit_s,
        ),
        tool,
        RunPython,
    )
