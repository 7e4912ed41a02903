"""The audit trail: who queried which source, downloaded or exported what, signed in or out,
and what admins changed. `rt.audit.record(...)` appends one entry; the admin view reads them.

- `event.py`: the entry (`AuditEvent`), the filter of the view (`AuditFilter`), a page;
- `trail.py`: `AuditTrail`, the front every caller holds: builds the entry, scrubs secrets,
  never raises into the caller, runs the retention sweep when it is due;
- `dayfiles.py`: the embedded set's log, one JSON-lines file per UTC day under <home>/audit/;
- the cluster set's table is `datadesk.cluster.audit`.
"""

from datadesk.audit.event import ACTIONS, OUTCOMES, AuditEvent, AuditFilter, AuditPage
from datadesk.audit.trail import AuditTrail, embedded_trail

__all__ = ["ACTIONS", "OUTCOMES", "AuditEvent", "AuditFilter", "AuditPage", "AuditTrail", "embedded_trail"]
