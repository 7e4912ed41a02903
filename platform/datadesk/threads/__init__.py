"""What is done to a thread outside its turns, each one service the composition root builds:
uploads and pasted tables into artifacts (`attachments.py`), clear and delete (`lifecycle.py`),
the analyst's own re-query (`requery.py`), and export to Markdown, a notebook and a zip
(`export.py`, `notebook.py`). Above `chat/` (they take the thread's turn slot from its
`TurnRegistry`), below the composition root and `api/`; the thread's records themselves are
owned by `store/threads.py`."""
