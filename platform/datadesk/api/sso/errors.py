"""What can go wrong in a single sign-on, each kind with the page the browser gets.

`SSOError` (base): `title` (the page's heading), the message (what happened and what to do),
`reason` (short words for the audit trail's `detail`, never a token or a code), `status`, and
`user` when the user is known (the audit entry names them).
- `SSOUnavailable` (404): single sign-on is not configured on this server;
- `ProviderUnreachable` (502): discovery, the JWKS, the token or userinfo endpoint could not be
  reached or answered nonsense; the message names the provider (its issuer URL);
- `ProviderRefused` (401): the provider answered the sign-in with an error (the user cancelled,
  a code reused or its PKCE verifier wrong);
- `FlowRejected` (400): the browser's return does not belong to a sign-in it started here
  (no or an expired flow cookie, a `state` that differs), or an unsafe return address;
- `TokenRejected` (401): the ID token failed a check (signature, issuer, audience, expiry,
  nonce, replay); `UnknownKey` is the one a JWKS refetch may cure (a rotated key);
- `SignInRefused` (403): the token is good but this person may not come in (no mapped group,
  a revoked user, a bad user-name claim, a name bound to another account).
"""

from __future__ import annotations


class SSOError(Exception):
    """A sign-in that cannot go on; its message is shown to the person signing in."""

    status = 400
    title = "Single sign-on failed"

    def __init__(self, message: str, reason: str, *, user: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.user = user

    @property
    def message(self) -> str:
        return str(self)


class SSOUnavailable(SSOError):
    status = 404
    title = "Single sign-on is not set up"


class ProviderUnreachable(SSOError):
    status = 502
    title = "The sign-in provider cannot be reached"


class ProviderRefused(SSOError):
    status = 401
    title = "The sign-in provider refused the sign-in"


class FlowRejected(SSOError):
    status = 400
    title = "This sign-in cannot be completed"


class TokenRejected(SSOError):
    status = 401
    title = "The sign-in was refused"


class UnknownKey(TokenRejected):
    """The token names a signing key (`kid`) the cached JWKS does not hold."""


class SignInRefused(SSOError):
    status = 403
    title = "You cannot sign in to DataDesk"
