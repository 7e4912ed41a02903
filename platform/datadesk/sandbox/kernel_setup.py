"""What every kernel runs when it starts: the chart house style of `kernel_style.py` (issue 32).

ipykernel runs each `--IPKernelApp.exec_lines` entry once before it answers; the entry here
executes the style file's source in a namespace of its own, so the analyst's namespace gets no
names from it. The file imports nothing heavy: matplotlib and altair are styled when the code
first imports them. A failing start-up line is logged by ipykernel and the kernel starts anyway.
"""

from __future__ import annotations

from pathlib import Path

STYLE_FILE = Path(__file__).with_name("kernel_style.py")


def setup_line() -> str:
    """The Python line that applies the house style in a kernel."""
    source = STYLE_FILE.read_text(encoding="utf-8")
    return f"exec(compile({source!r}, '<datadesk kernel style>', 'exec'), {{'__name__': '_datadesk_style'}})"


def kernel_args() -> tuple[str, ...]:
    """The ipykernel command-line options that run the start-up line."""
    return (f"--IPKernelApp.exec_lines={setup_line()}",)
