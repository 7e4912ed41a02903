"""A thread's report page (issue 32): `pins` stores what the analyst pinned (the thread's
`report` document), `view` resolves each item against the thread as it is now (newest chart
versions, table pages, refresh marks), `markdown` exports it. The HTML page and the API are in
api/report/."""
