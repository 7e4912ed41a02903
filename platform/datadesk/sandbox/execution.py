"""One execute request's result and the wait for it, whatever carries the messages.

Transport-independent: the ZMQ `messaging.KernelChannel` and the websocket
`backends/gateway/channel.GatewayChannel` both build on it.

- `ExecutionCollector`: turns one request's iopub messages and shell reply into
  an `ExecutionResult` (stream output capped head + tail by `_OutputCapper`,
  the full text in a file; PNG images once each, with the title and dark-theme variant
  the house style sends; Vega-Lite charts as sent; errors trimmed).
- `PendingExecution`: the wait for it (deadline, interrupt, grace, death);
  `ExecutionChannel`: what a channel keeps to run code (caps, liveness, grace).
- `strip_ansi`, `trim_traceback`: make error output fit for the model.
"""

from __future__ import annotations

import base64
import binascii
import collections
import logging
import os
import re
import time
from pathlib import Path
from typing import IO, Any, Awaitable, Callable

from datadesk.sandbox.base import ChartOutput, ErrorInfo, ExecutionResult, ImageExtras, OnOutput, OnStatus

log = logging.getLogger(__name__)

# what kernel_style.py sends beside a figure, and the Vega-Lite bundles (v4, v5 as
# "+json"; Altair 6 writes v6 as ".json")
FIGURE_MIME = "application/vnd.datadesk.figure+json"
VEGALITE_MIME = re.compile(r"application/vnd\.vegalite\.v[4-6][+.]json")
HEAD_CHARS = 20_000
TAIL_CHARS = 10_000
FILE_CAP_BYTES = 50 * 1024 * 1024
TRACEBACK_MAX_LINES = 40

# How long to wait for the kernel to go idle after an interrupt (then it is restarted).
INTERRUPT_GRACE_S = 3.0
# iopub poll granularity; also how often liveness is checked while silent.
POLL_S = 0.25
# After the shell execute_reply arrived, how long iopub may stay silent before the
# request is treated as finished even without its `status: idle` (a dropped message).
IDLE_AFTER_REPLY_S = 2.0
# While iopub is silent, ask the backend whether the process lives at most this often.
LIVENESS_EVERY_S = 0.5


# --------------------------------------------------------------------------- text

_ANSI_RE = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC ... BEL / ST (e.g. hyperlinks)
    r"|\x1b\[[0-?]*[ -/]*[@-~]"  # CSI ... final byte (colors, cursor)
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
)


def strip_ansi(text: str) -> str:
    return _ANSI_RE.sub("", text)


_FRAME_FILE_RE = re.compile(r"^\s*File\s+(?:\"([^\"]+)\"|(\S+?)(?::\d+)?)[,:\s]")
_INTERNAL_PARTS = ("/IPython/", "/ipykernel/", "/ipykernel_launcher", "/traitlets/", "<frozen runpy>")


# IPython's "Context"/"Verbose" header: "ZeroDivisionError      Traceback (most recent call last)"
_CONTEXT_HEADER_RE = re.compile(r"^\S+\s+Traceback \(most recent call last\)\s*$")


def _is_internal_frame(entry: str) -> bool:
    first = entry.lstrip("\n").split("\n", 1)[0]
    m = _FRAME_FILE_RE.match(first)
    if not m:
        return False
    path = m.group(1) or m.group(2) or ""
    return any(part in path for part in _INTERNAL_PARTS)


def trim_traceback(tb: list[str], max_lines: int = TRACEBACK_MAX_LINES) -> list[str]:
    """IPython's traceback list -> plain lines for the model.

    ANSI codes are stripped, the `-----` rule and IPython/ipykernel internal
    frames are dropped, runs of identical frames (recursion) are collapsed,
    user-code (and library) frames and the final error line are kept; at most
    `max_lines` lines (the head and the end are kept).
    """
    entries: list[str] = []
    repeats = 0
    for entry in tb:
        entry = strip_ansi(entry).rstrip("\n")
        if not entry.strip() or set(entry.strip()) <= {"-"}:
            continue
        if _is_internal_frame(entry):
            continue
        if _CONTEXT_HEADER_RE.match(entry):
            entry = "Traceback (most recent call last):"
        if entries and entry == entries[-1]:
            repeats += 1
            continue
        if repeats:
            entries.append(f"  [previous frame repeated {repeats} more times]")
            repeats = 0
        entries.append(entry)
    if repeats:
        entries.append(f"  [previous frame repeated {repeats} more times]")
    lines: list[str] = []
    for entry in entries:
        lines.extend(line.rstrip() for line in entry.split("\n"))
# Collapse runs of blank lines.
    out: list[str] = []
    for line in lines:
        if not line.strip() and (not out or not out[-1].strip()):
            continue
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    if len(out) > max_lines:
        head = max_lines // 3
        tail = max_lines - head - 1
        omitted = len(out) - head - tail
        out = out[:head] + [f"... ({omitted} traceback lines omitted) ..."] + out[-tail:]
    return out


# --------------------------------------------------------------------------- output caps


class _OutputCapper:
    """Head + tail of stdout/stderr in memory, the whole stream (capped) in a file.

    Memory is bounded by `head_chars + tail_chars` (plus one chunk being split),
    whatever the volume. The file is created on the first output and removed at
    the end when nothing was cut.
    """

    def __init__(self, run_dir: Path, head_chars: int, tail_chars: int, file_cap_bytes: int):
        self.run_dir = run_dir
        self.head_chars = head_chars
        self.tail_chars = tail_chars
        self.file_cap_bytes = file_cap_bytes
        self.head: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.head_len = 0
        self.tail: collections.deque[tuple[str, str]] = collections.deque()
        self.tail_len = 0
        self.total = {"stdout": 0, "stderr": 0}
        self.kept = {"stdout": 0, "stderr": 0}  # chars in head + tail per stream
        self.path: Path | None = None
        self._file: IO[bytes] | None = None
        self._file_bytes = 0
        self._file_full = False

    def _open_file(self) -> None:
        n = 1
        while True:
            path = self.run_dir / f"output-{n}.txt"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                n += 1
                continue
            self.path = path
            self._file = os.fdopen(fd, "wb")
            return

    def _write_file(self, text: str) -> None:
        if self._file_full:
            return
        if self._file is None:
            try:
                self._open_file()
            except OSError as e:
                log.warning("cannot save kernel output in %s: %s", self.run_dir, e)
                self._file_full = True
                return
        assert self._file is not None
        data = text.encode("utf-8", "replace")
        room = self.file_cap_bytes - self._file_bytes
        if len(data) > room:
            data = data[:room]
            self._file_full = True
        try:
            self._file.write(data)
        except OSError as e:
            log.warning("cannot save kernel output in %s: %s", self.path, e)
            self._file_full = True
            return
        self._file_bytes += len(data)
        if self._file_full:
            self._file.write(b"\n[output file cap reached; the rest was dropped]\n")

    def add(self, name: str, text: str) -> None:
        if name not in self.total:
            name = "stdout"
        if not text:
            return
        self.total[name] += len(text)
        self._write_file(text)
        room = max(0, self.head_chars - self.head_len)
        if room > 0:
            part = text[:room]
            self.head[name].append(part)
            self.head_len += len(part)
            self.kept[name] += len(part)
            if len(text) <= room:
                return
        if self.tail_chars <= 0:
            return
        # Slice once: never copy the middle of a huge chunk.
        text = text[max(room, len(text) - self.tail_chars) :]
        self.tail.append((name, text))
        self.tail_len += len(text)
        self.kept[name] += len(text)
        while self.tail_len > self.tail_chars:
            old_name, old = self.tail[0]
            excess = self.tail_len - self.tail_chars
            if len(old) <= excess:
                self.tail.popleft()
                self.tail_len -= len(old)
                self.kept[old_name] -= len(old)
            else:
                self.tail[0] = (old_name, old[excess:])
                self.tail_len -= excess
                self.kept[old_name] -= excess

    @property
    def truncated(self) -> bool:
        return any(self.total[n] > self.kept[n] for n in self.total)

    def finish(self) -> tuple[str, str, bool, int, Path | None]:
        """(stdout, stderr, truncated, total chars, file when truncated)."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        truncated = self.truncated
        texts: dict[str, str] = {}
        for name in ("stdout", "stderr"):
            head = "".join(self.head[name])
            tail = "".join(t for n, t in self.tail if n == name)
            omitted = self.total[name] - self.kept[name]
            if omitted > 0:
                texts[name] = f"{head}\n... [{omitted} characters omitted] ...\n{tail}"
            else:
                texts[name] = head + tail
        path = self.path
        if not truncated and path is not None:
            try:
                path.unlink()
            except OSError:
                pass
            path = None
        return (
            texts["stdout"],
            texts["stderr"],
            truncated,
            self.total["stdout"] + self.total["stderr"],
            path,
        )


# --------------------------------------------------------------------------- results


class ExecutionCollector:
    """The result of one execute request, built from the kernel's messages.

    Transport-agnostic (ZMQ in messaging.py, a websocket in backends/gateway/channel.py):
    the caller feeds the iopub messages whose parent is the request (`on_iopub`
    says when the kernel went idle) and the shell reply, then calls `finish`. Stream output
    is capped head + tail with the full text in a file under `run_dir`; PNG
    images are kept once each; errors get ANSI stripped and the traceback
    trimmed.
    """

    def __init__(self, run_dir: Path, head_chars: int = HEAD_CHARS, tail_chars: int = TAIL_CHARS,
                 file_cap_bytes: int = FILE_CAP_BYTES, on_output: OnOutput | None = None):
        self.started = time.monotonic()
        self.out = _OutputCapper(run_dir, head_chars, tail_chars, file_cap_bytes)
        self.on_output = on_output
        self.result: str | None = None
        self.error: ErrorInfo | None = None
        self.images: list[bytes] = []
        self.image_extras: list[ImageExtras] = []
        self.charts: list[ChartOutput] = []

    def on_iopub(self, msg: dict) -> bool:
        """Take one iopub message of this request; True when it reports the kernel idle."""
        mtype = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
        content = msg.get("content", {}) or {}
        if mtype == "status":
            return content.get("execution_state") == "idle"
        if mtype == "stream":
            self._add(str(content.get("name", "stdout")), str(content.get("text", "")).replace("\r\n", "\n"))
        elif mtype in ("execute_result", "display_data", "update_display_data"):
            data = content.get("data", {}) or {}
            png = data.get("image/png")
            if png:
                self._image(png, data.get(FIGURE_MIME))
            chart = next((k for k in data if VEGALITE_MIME.fullmatch(str(k))), None)
            if chart is not None:
                self.charts.append(ChartOutput(mime=str(chart), spec=data[chart]))
            text = data.get("text/plain")
            if mtype == "execute_result":
                # a chart as the cell's value: its text is Altair's "<VegaLite 6 object>"
                self.result = text if isinstance(text, str) and chart is None else None
            elif not png and chart is None and isinstance(text, str):
                self._add("stdout", text if text.endswith("\n") else text + "\n")
        elif mtype == "error":
            self.error = _error_info(content)
        return False

    def _image(self, png: Any, extras: Any) -> None:
        try:
            raw = png if isinstance(png, bytes) else base64.b64decode(png)
        except (binascii.Error, ValueError, TypeError):
            log.debug("undecodable image/png from kernel")
            return
        # A figure that is the cell's value is also flushed by the
        # inline backend at the end of the cell: keep one copy.
        if raw in self.images:
            return
        self.images.append(raw)
        self.image_extras.append(_image_extras(extras))

    def _add(self, name: str, text: str) -> None:
        self.out.add(name, text)
        if self.on_output is not None and text:
            try:
                self.on_output(name if name == "stderr" else "stdout", text)
            except Exception:  # live output is advice: it never breaks the execution
                log.debug("on_output callback failed", exc_info=True)

    def finish(self, reply: dict | None, *, timed_out: bool = False, died: bool = False,
               note: str = "") -> ExecutionResult:
        """The result, given the shell reply (None when it never came) and how the wait ended."""
        content = (reply or {}).get("content", {}) or {}
        error = self.error
        if error is None and content.get("status") == "error":
            error = _error_info(content)
        if died:
            status = "died"
        elif timed_out:
            status = "timeout"
        elif error is not None or content.get("status") in ("error", "aborted"):
            status = "error"
            if error is None:
                error = ErrorInfo(ename="Aborted", evalue="the execution was aborted", traceback=[])
        else:
            status = "ok"
        stdout, stderr, truncated, total, path = self.out.finish()
        expressions = content.get("user_expressions")
        return ExecutionResult(
            expressions=expressions if isinstance(expressions, dict) else {},
            status=status,  # type: ignore[arg-type]
            stdout=stdout,
            stderr=stderr,
            result=self.result,
            error=error,
            images=self.images,
            image_extras=self.image_extras,
            charts=self.charts,
            output_truncated=truncated,
            output_chars=total,
            stdout_file=path,
            duration_ms=(time.monotonic() - self.started) * 1000.0,
            note=note,
        )


def _image_extras(extras: Any) -> ImageExtras:
    """The title and dark-theme PNG the house style sent beside a figure (nothing when absent
    or not what kernel_style.py sends)."""
    if not isinstance(extras, dict):
        return ImageExtras()
    title = extras.get("title")
    dark = None
    if isinstance(extras.get("dark"), str):
        try:
            dark = base64.b64decode(extras["dark"])
        except (binascii.Error, ValueError):
            log.debug("undecodable dark figure from kernel")
    return ImageExtras(title=title[:200] if isinstance(title, str) and title.strip() else None, dark=dark)


def _error_info(content: dict) -> ErrorInfo:
    return ErrorInfo(
        ename=str(content.get("ename", "")),
        evalue=strip_ansi(str(content.get("evalue", ""))),
        traceback=trim_traceback(list(content.get("traceback", []) or [])),
    )


# --------------------------------------------------------------------------- channel

IsAlive = Callable[[], Awaitable[bool]]
OnTimeout = Callable[[], Awaitable[None]]

# What a transport's `receive` answers besides an iopub message of the execution.
QUIET = "quiet"  # nothing came within the poll
NEWS = "news"  # a message of the execution that is no output (its shell reply: `PendingExecution.got_reply`)
SKIP = "skip"  # a message of something else
END = "end"  # the transport ended the wait itself (it set `died`, `settled` or the collector's error)
Received = dict | str


class PendingExecution:
    """The wait for one execute request, whatever carries its messages (ZMQ or a websocket).

    `wait` drives the deadline: on timeout it awaits `on_timeout()` (an
    interrupt), then waits `grace_s` more for idle (status "timeout"; `note`
    says when even that passed). While nothing comes it treats a shell reply
    followed by silence as the end (the idle status was lost) and asks
    `is_alive()` now and then ("died"). `receive(timeout_s)` is the transport:
    an iopub message of this execution, or one of QUIET, NEWS, SKIP, END.
    After `wait`, `settled` says whether the kernel went idle.
    """

    def __init__(self, collected: ExecutionCollector, timeout_s: float, grace_s: float,
                 on_status: OnStatus | None = None):
        self.collected = collected
        self.on_status = on_status
        self.grace_s = grace_s
        self.deadline = collected.started + timeout_s
        self.reply: dict | None = None
        self.reply_at = 0.0
        self.last_msg = time.monotonic()
        self.timed_out = self.died = self.settled = False
        self.note = ""

    def got_reply(self, msg: dict) -> None:
        self.reply, self.reply_at = msg, time.monotonic()

    async def wait(self, receive: Callable[[float], Awaitable[Received]], is_alive: IsAlive,
                   on_timeout: OnTimeout, kernel: str = "the kernel") -> None:
        last_liveness = 0.0
        while True:
            now = time.monotonic()
            if now >= self.deadline:
                if self.timed_out:
                    self.note = "the kernel did not stop after the interrupt"
                    return
                self.timed_out = True
                tell_status(self.on_status, "the time limit was reached: interrupting the code")
                try:
                    await on_timeout()
                except Exception as e:
                    log.warning("interrupting %s failed: %s", kernel, e)
                self.deadline = time.monotonic() + self.grace_s
                continue
            msg = await receive(min(POLL_S, max(0.0, self.deadline - now)))
            if msg == END:
                return
            if msg == QUIET:
                quiet = time.monotonic() - self.last_msg
                if (self.reply is not None and time.monotonic() - self.reply_at > IDLE_AFTER_REPLY_S
                        and quiet > IDLE_AFTER_REPLY_S):
                    self.settled = True  # the idle status was lost (iopub high-water mark); the reply is final
                    return
                if quiet >= POLL_S and time.monotonic() - last_liveness >= LIVENESS_EVERY_S:
                    last_liveness = time.monotonic()
                    if not await is_alive():
                        self.died = True
                        return
                continue
            if msg == SKIP:
                continue
            self.last_msg = time.monotonic()  # NEWS or an iopub message
            if isinstance(msg, dict) and self.collected.on_iopub(msg):
                self.settled = True
                return

    def finish(self) -> ExecutionResult:
        return self.collected.finish(self.reply, timed_out=self.timed_out, died=self.died, note=self.note)


class ExecutionChannel:
    """What a channel to one kernel (ZMQ or websocket) keeps to run code: where cut output goes,
    the caps, the liveness check, the interrupt grace; `settled` as `PendingExecution.settled` of
    the last run."""

    def __init__(self, run_dir: Path, is_alive: IsAlive, *, head_chars: int = HEAD_CHARS,
                 tail_chars: int = TAIL_CHARS, file_cap_bytes: int = FILE_CAP_BYTES,
                 interrupt_grace_s: float = INTERRUPT_GRACE_S):
        self.run_dir = run_dir
        self.is_alive = is_alive
        self.head_chars = head_chars
        self.tail_chars = tail_chars
        self.file_cap_bytes = file_cap_bytes
        self.interrupt_grace_s = interrupt_grace_s
        self.settled = True

    def _execution(self, timeout_s: float, on_output: OnOutput | None = None, on_status: OnStatus | None = None,
                   grace_s: float | None = None) -> PendingExecution:
        self.settled = False
        collected = ExecutionCollector(self.run_dir, self.head_chars, self.tail_chars, self.file_cap_bytes,
                                       on_output=on_output)
        grace = self.interrupt_grace_s if grace_s is None else grace_s
        return PendingExecution(collected, timeout_s, grace, on_status)


async def _no_interrupt() -> None:
    pass


# A silent cell that only carries the health checks (user expressions) and says "idle again".
PROBE_CODE = "pass"


async def probe_channel(channel: Any, timeout_s: float) -> ExecutionResult:
    """A silent `pass` on `channel` (KernelChannel or GatewayChannel) that waits at most `timeout_s`
    for the kernel to answer, never interrupting it: after an interrupt it says whether the kernel
    is idle again (`channel.settled`), and its reply carries the health checks."""
    return await channel.run(PROBE_CODE, timeout_s, _no_interrupt, silent=True, grace_s=0.0)


class ChannelProbe:
    """`Kernel.probe` for kernels that talk through a `_channel` (local, docker, gateway)."""

    _channel: Any

    async def probe(self, timeout_s: float) -> ExecutionResult | None:
        """A silent probe that never interrupts (status "ok": idle and answering); None when not running."""
        if self._channel is None or not await self.is_alive():  # type: ignore[attr-defined]
            return None
        return await probe_channel(self._channel, timeout_s)


def tell_status(on_status: OnStatus | None, message: str) -> None:
    if on_status is not None:
        try:
            on_status(message)
        except Exception:
            log.debug("on_status callback failed", exc_info=True)

