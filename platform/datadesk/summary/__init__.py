"""Thread summaries (DESIGN section 8).

- `model`: the `ThreadSummary` structure and how it is rendered for the model;
- `store`: `summary.json` plus a bounded `summary.revisions.jsonl`, written under
  the thread lock with the epoch and coverage guards;
- `summarizer`: asks a chat model to update the previous summary with only the
  records that newly left the window, validates the JSON and enforces the
  constraint-keeping rule and the token cap;
- `service`: when a refresh is due, background jobs serialized per thread, and
  the synchronous refresh used by the "no gap" rule.
"""
