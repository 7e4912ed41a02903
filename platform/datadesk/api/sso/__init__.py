"""OpenID Connect single sign-on (`[auth.oidc]`), cut along its seams:

- `errors.py`: `SSOError` and its kinds, each with the page title and the short reason the
  audit trail records;
- `flow.py`: one sign-in attempt's `state`, `nonce` and PKCE verifier, sealed into a short-lived
  cookie of the browser that started it, and the check that a return address is a path of this app;
- `idtoken.py`: the ID token's signature and claims (OIDC Core 3.1.3.7), a pure function;
- `oidc.py`: `OIDCClient`, the provider as DataDesk talks to it (discovery, JWKS with key rotation,
  the code exchange with Authlib, userinfo, the end-session URL), asynchronous with timeouts;
- `grants.py`: the user name and groups a sign-in's claims give, and the workspaces and
  permissions the mapped groups grant;
- `signin.py`: `SSOSignIn`, the service the routes (api/controllers/oidc.py) call: a callback's
  code -> a checked, synced DataDesk user.
"""
