"""Upload bombs (issue 15): peak RSS and time to refusal of each, read the way an upload is
(`file_batches` under the default `offload.upload_max_*` limits, every batch consumed), each
in a fresh process so its peak RSS is its own ("app"; an .xlsx parse's child is reported apart).
Prints a table, writes bench/results/upload_bombs.json.

    python bench/upload_bombs.py [--quick]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from tests.integration.test_limits_uploads import (_NS, inline, num, shared_strings_bomb,  # noqa: E402
                                                   sheet_xml, xlsx)

CHILD = r"""
import json, resource, sys, time
from datadesk.offload.readers import file_batches, sniff_file
from datadesk.threads.attachments import upload_limits
from datadesk.settings import OffloadSettings
t0 = time.monotonic()
out = {"rows": 0}
try:
    fmt = sniff_file(sys.argv[1])
    if fmt not in ("csv", "tsv", "xlsx", "parquet", "json"):
        raise ValueError(f"unsupported type {fmt}")
    _, batches = file_batches(sys.argv[1], fmt, limits=upload_limits(OffloadSettings()).started())
    for b in batches:
        out["rows"] += b.num_rows
    out["result"] = "accepted"
except Exception as exc:
    out["result"] = f"{type(exc).__name__}: {exc}"[:160]
out["seconds"] = round(time.monotonic() - t0, 2)
# VmHWM, not ru_maxrss: that one keeps the forking parent's peak across exec
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
out["peak_rss_mb"] = round(int(hwm.split()[1]) / 1024)
out["child_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
print(json.dumps(out))
"""


def small_strings(path: Path, unpacked: int) -> Path:
    """Many short unique shared strings: the most Python objects per unpacked byte, ratio ~10:1."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("[Content_Types].xml", xlsx.__globals__["_CT"])
        zf.writestr("_rels/.rels", xlsx.__globals__["_RELS"])
        zf.writestr("xl/workbook.xml", xlsx.__globals__["_WB"])
        zf.writestr("xl/_rels/workbook.xml.rels", xlsx.__globals__["_WB_RELS"])
        zf.writestr("xl/worksheets/sheet1.xml", sheet_xml([(1, ['<c r="A1" t="s"><v>0</v></c>'])]))
        with zf.open("xl/sharedStrings.xml", "w", force_zip64=True) as out:
            out.write(f"<sst {_NS}>".encode())
            i = written = 0
            while written < unpacked:
                chunk = "".join(f"<si><t>{n}</t></si>" for n in range(i, i + 100_000)).encode()
                i += 100_000
                out.write(chunk)
                written += len(chunk)
            out.write(b"</sst>")
    return path


def sheet_rows(path: Path, rows: int) -> Path:
    body = [(1, [inline("A1", "n")])] + [(r, [num(f"A{r}", r)]) for r in range(2, rows + 1)]
    return xlsx(path, sheet_xml(body))


def one_cell_csv(path: Path, cell_mb: int) -> Path:
    with open(path, "wb") as f:
        f.write(b"a,b\n1,x\n2,x\n3,x\n4,\"")
        block = b"y" * (1 << 20)
        for _ in range(cell_mb):
            f.write(block)
        f.write(b"\"\n5,z\n")
    return path


def nested_zip(path: Path, levels: int) -> Path:
    import io
    data = b"x" * 1000
    name = "a.txt"
    for i in range(levels):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(name, data)
        data, name = buf.getvalue(), f"level{i}.zip"
    path.write_bytes(data)
    return path


def main() -> None:
    quick = "--quick" in sys.argv
    tmp = Path(tempfile.mkdtemp(prefix="bombs-"))
    gib = 1024**3
    bombs = [
        ("xlsx shared strings 1 GiB ('A' * 1 MiB)", lambda p: shared_strings_bomb(p, (64 << 20) if quick else gib)),
        ("xlsx shared strings, 128 MiB of short unique strings", lambda p: small_strings(p, 128 << 20)),
        ("xlsx shared strings, 480 MiB of short unique strings", lambda p: small_strings(p, 480 << 20)),
        ("xlsx shared strings, 80 MiB of short unique strings", lambda p: small_strings(p, 80 << 20)),
        ("xlsx sheet bomb: one cell at row 60,000,000",
         lambda p: xlsx(p, sheet_xml([(1, [inline("A1", "n")]), (2, [num("A2", 1)]),
                                      (60_000_000, [num("A60000000", 2)])]))),
        ("xlsx 1,048,576 real rows (in limits)", lambda p: sheet_rows(p, 200_000 if quick else 1_048_576)),
        ("CSV, line 5 one 200 MB cell", lambda p: one_cell_csv(p, 20 if quick else 200)),
        ("50-level nested zip", lambda p: nested_zip(p, 50)),
    ]
    if quick:
        bombs = [b for b in bombs if "480" not in b[0]]
    results = []
    for name, build in bombs:
        t0 = time.monotonic()
        path = build(tmp / "bomb.bin")
        built = time.monotonic() - t0
        size = path.stat().st_size
        proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True,
                              timeout=900, cwd=str(Path(__file__).resolve().parents[1] / "platform"))
        row = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {
            "result": f"child failed: {proc.stderr[-200:]}", "seconds": None, "peak_rss_mb": None}
        row.update(bomb=name, file_mb=round(size / 1e6, 2), build_s=round(built, 1))
        results.append(row)
        print(f"{name:55} {row['file_mb']:>9.2f} MB  {row['peak_rss_mb']!s:>6} MB app RSS "
              f"{row.get('child_peak_rss_mb')!s:>6} MB child  "
              f"{row['seconds']!s:>7} s  {row['result'][:110]}", flush=True)
        path.unlink()
    out = Path(__file__).resolve().parent / "results" / "upload_bombs.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"quick": quick, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
