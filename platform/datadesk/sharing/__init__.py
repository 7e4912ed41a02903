"""Sharing a thread read-only inside its workspace, and copying it into one's own chats (issue 32):
`service.py` holds the rules and the audit, `fork.py` the copy. Storage: `store.interfaces.shares`."""
