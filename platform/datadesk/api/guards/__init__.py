"""What stands between a request and a controller: who is asking (`auth.py`: token or session
cookie), what they may reach (`access.py`: their workspaces, threads and artifacts, else 404),
browser security on every response (`security.py`: CSP, CSRF, the login limit), and how much of
the server they may take (`ratelimit.py`: request budget and in-flight caps)."""
