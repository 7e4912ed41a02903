"""An .xlsx parsed in a child process of bounded memory, started by `openpyxl_engine` (its
`_in_child`): `python -m datadesk.offload.readers.excel.child '<spec as JSON>'`.

Each batch is written as a length-prefixed Arrow IPC stream to the file the spec names; the
exit status says how it ended (0; CHILD_LIMIT or CHILD_PARSE with the message on stdout;
CHILD_MEMORY), and the parent reads the batches back once it succeeded.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from datadesk.offload.readers.errors import LimitExceeded, TabularParseError
from datadesk.offload.readers.excel.openpyxl_engine import CHILD_LIMIT, CHILD_MEMORY, CHILD_PARSE, open_sheet
from datadesk.offload.readers.limits import UploadLimits


def main(spec: dict[str, Any]) -> int:
    """Parse the sheet `spec` names into `spec["out"]`; the exit status says how it ended."""
    limits = UploadLimits(**spec["limits"]).started()
    try:
        with open(spec["out"], "wb") as fh:
            for batch in open_sheet(Path(spec["path"]), spec["sheet"], spec["batch_rows"], limits):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as writer:
                    writer.write_batch(batch)
                data = sink.getvalue()
                fh.write(struct.pack("<Q", data.size))
                fh.write(data)
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
