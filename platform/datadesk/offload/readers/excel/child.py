"""An .xlsx parsed in a child process of bounded memory, started by `openpyxl_engine` (its
`_in_child`): `python -m datadesk.offload.readers.excel.child '<spec as JSON>'`.

It writes frames (`openpyxl_engine.FRAME`: a kind and a length) to the file the spec names: per
sheet "S" (its name as JSON), then each batch as "B" (an Arrow IPC stream) or "K" (skipped:
why), then "E" (its layout: shape and reading, as JSON). The spec's `sheet` names one sheet
(default: the first), `all` asks for every sheet. The exit status says how it ended (0;
CHILD_LIMIT or CHILD_PARSE with the message on stdout; CHILD_MEMORY), and the parent reads the
frames back once it succeeded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from datadesk.offload.readers.errors import LimitExceeded, TabularParseError
from datadesk.offload.readers.excel.openpyxl_engine import (CHILD_LIMIT, CHILD_MEMORY, CHILD_PARSE, FRAME,
                                                            open_sheet, read_sheets)
from datadesk.offload.readers.limits import UploadLimits


def _frame(fh: BinaryIO, kind: bytes, data: Any) -> None:
    fh.write(FRAME.pack(kind, len(data)))
    fh.write(data)


def _sheet(fh: BinaryIO, name: str, stream: Any) -> None:
    _frame(fh, b"S", json.dumps(name).encode())
    for batch in stream:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        _frame(fh, b"B", sink.getvalue())
    facts = stream.facts  # complete once the rows are read (a totals row at the end)
    _frame(fh, b"E", json.dumps({"shape": facts.shape, "reading": facts.reading}).encode())


def main(spec: dict[str, Any]) -> int:
    """Parse the sheet(s) `spec` names into `spec["out"]`; the exit status says how it ended."""
    limits = UploadLimits(**spec["limits"]).started()
    path = Path(spec["path"])
    try:
        with open(spec["out"], "wb") as fh:
            if spec.get("all"):
                for table in read_sheets(path, spec["batch_rows"], limits):
                    if table.stream is None:
                        _frame(fh, b"S", json.dumps(table.name).encode())
                        _frame(fh, b"K", json.dumps(table.skipped).encode())
                    else:
                        _sheet(fh, table.name, table.stream)
            else:
                stream = open_sheet(path, spec["sheet"], spec["batch_rows"], limits)
                _sheet(fh, (stream.facts.reading or {}).get("sheet", spec["sheet"] or ""), stream)
    except LimitExceeded as exc:
        sys.stdout.write(str(exc))
        return CHILD_LIMIT
    except TabularParseError as exc:
        sys.stdout.write(str(exc))
        return CHILD_PARSE
    except MemoryError:
        return CHILD_MEMORY
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
