"""Long-term memory: facts a user wants kept across threads (DESIGN section 8).

Off by default. Memory acts for a user in a workspace only when all three
allow it: the workspace flag (`memory = true` in `workspace.toml`), the
user's `memory` permission, and the user's own switch in the memory panel
(stored in `memory.json`, on by default once the other two allow).

- `model.py`: the `Fact` record, normalisation, the contradiction rule, the
  capacity score and `render_memory_block` (what is injected into the model).
- `store.py`: `MemoryStore`, one `memory.json` per workspace + user, every
  rule (candidates, conflicts, caps, soft forget, hard delete with summary
  redaction) and the append-only audit log (`memory.audit.jsonl`, no text).
- `secrets.py`: deterministic secret detection (API keys, passwords, tokens,
  private keys, connection strings, AWS keys, JWTs, card numbers).
- `extraction.py`: optional background extraction of candidate facts from the
  user's own messages (off by default).

The tools (`remember`, `forget`) live in `datadesk.tools.memory`, the panel
API in `datadesk.api.controllers.memory`.
"""
