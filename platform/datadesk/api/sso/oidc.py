"""`OIDCClient`: the OpenID provider as DataDesk talks to it, one per app.

- discovery: `<issuer>/.well-known/openid-configuration`, kept `DISCOVERY_TTL_S`, dropped when a
  call to the provider fails (so the next sign-in reads it again: a provider that moved an
  endpoint is picked up); its `issuer` must be the configured one (OIDC Discovery 4.3);
- keys: the JWKS from `jwks_uri`, cached; a token signed with a key the cache lacks (the provider
  rotated its keys) refetches it once, at most every `jwks_refetch_s` seconds, so a stream of
  forged tokens with invented key ids cannot make DataDesk hammer the provider;
- the code exchange with Authlib's `AsyncOAuth2Client` (PKCE verifier, client secret read from
  `${env:VAR}` at the call, basic or post client authentication as the provider offers);
- the ID token's checks (idtoken.py), then its nonce spent once (`NonceLedger`): a token
  played back is refused even where the rest of it would pass;
- userinfo (claims a provider leaves out of the ID token) and the RP-initiated logout URL.

Every call is asynchronous with `timeout_s`; a provider that cannot be reached, times out or
answers nonsense is a `ProviderUnreachable` naming its issuer URL.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import time
from typing import Any, Callable
from urllib.parse import urlencode

import httpx
import msgspec
from authlib.integrations.base_client.errors import OAuthError
from authlib.integrations.httpx_client import AsyncOAuth2Client
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc.jwk import KeySet

from datadesk.api.sso.errors import FlowRejected, ProviderRefused, ProviderUnreachable, SSOError, TokenRejected
from datadesk.api.sso.flow import FLOW_TTL_S, Flow
from datadesk.api.sso.idtoken import LEEWAY_S, check_claims, check_signature, token_header
from datadesk.settings import OIDCSettings
from datadesk.sources.config import SourceConfigError, resolve_env
from datadesk.store.interfaces.counters import MemoryCounter, RateCounter

DISCOVERY_TTL_S = 3600.0
JWKS_REFETCH_S = 30.0
TIMEOUT_S = 10.0


def _http_errors() -> tuple[type[BaseException], ...]:
    """What a failed call raises: httpx's errors and, where Authlib uses it, httpx2's; a body
    that is not JSON (ValueError); a socket error."""
    errors: list[type[BaseException]] = [httpx.HTTPError, httpx.InvalidURL, OSError, ValueError]
    try:
        import httpx2  # Authlib's HTTP client where installed (authlib.integrations.httpx_client._compat)
        errors += [httpx2.HTTPError, httpx2.InvalidURL]
    except ImportError:
        pass
    return tuple(errors)


HTTP_ERRORS = _http_errors()
_TLS: list[ssl.SSLContext] = []


async def tls_context() -> ssl.SSLContext:
    """One TLS context for every call to the provider: the system's trusted CAs (`SSL_CERT_FILE`
    and `SSL_CERT_DIR` add an organisation's own), read once, off the event loop."""
    if not _TLS:
        _TLS.append(await asyncio.to_thread(ssl.create_default_context))
    return _TLS[0]


class ProviderMetadata(msgspec.Struct):
    """The parts of the discovery document DataDesk uses."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None = None
    end_session_endpoint: str | None = None
    id_token_signing_alg_values_supported: list[str] = msgspec.field(default_factory=lambda: ["RS256"])
    token_endpoint_auth_methods_supported: list[str] = msgspec.field(
        default_factory=lambda: ["client_secret_basic"])


class NonceLedger:
    """The nonces of accepted ID tokens, each spendable once. Counted in the set's `RateCounter`
    (shared by every host with the cluster set; this process's memory otherwise), for twice
    the life of a sign-in attempt, after which the flow cookie carrying it is dead anyway."""

    def __init__(self, counter: RateCounter | None = None) -> None:
        self.counter: RateCounter = counter if counter is not None else MemoryCounter()

    def spend(self, nonce: str) -> bool:
        """True the first time `nonce` is spent, False after."""
        key = "oidc:nonce:" + hashlib.sha256(nonce.encode()).hexdigest()[:40]
        return self.counter.hit(key, 2 * FLOW_TTL_S) == 1


class OIDCClient:
    """The configured provider (`auth.oidc`), its metadata and keys cached."""

    def __init__(self, settings: OIDCSettings, *, counter: RateCounter | None = None,
                 timeout_s: float = TIMEOUT_S, jwks_refetch_s: float = JWKS_REFETCH_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.issuer = settings.issuer  # compared exactly: a trailing slash matters (OIDC Discovery 4.3)
        self.timeout_s = timeout_s
        self.jwks_refetch_s = jwks_refetch_s
        self.clock = clock
        self.nonces = NonceLedger(counter)
        self._meta: tuple[float, ProviderMetadata] | None = None
        self._keys: tuple[float, KeySet] | None = None
        self.jwks_fetches = 0  # how often the JWKS was read (tests of key rotation read it)

    # -- the provider's documents ----------------------------------------------------------
    def _unreachable(self, what: str, exc: BaseException | str) -> ProviderUnreachable:
        self.forget()
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {str(exc)[:200]}"
        return ProviderUnreachable(f"DataDesk could not {what} at the sign-in provider {self.issuer} ({why}). "
                                   "Try again in a moment; if it goes on, an admin should check "
                                   "auth.oidc.issuer and that this server can reach the provider.",
                                   f"sso: provider unreachable ({what})")

    def forget(self) -> None:
        """Drop the cached metadata and keys: the next call reads them again."""
        self._meta = None
        self._keys = None

    async def _get_json(self, url: str, what: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, verify=await tls_context()) as http:
                r = await http.get(url, headers={"Accept": "application/json", **(headers or {})})
            if r.status_code != 200:
                raise self._unreachable(what, f"HTTP {r.status_code} from {url}")
            doc = r.json()
        except HTTP_ERRORS as exc:
            raise self._unreachable(what, exc) from None
        if not isinstance(doc, dict):
            raise self._unreachable(what, f"{url} did not answer a JSON object")
        return doc

    async def metadata(self) -> ProviderMetadata:
        """The discovery document (cached for `DISCOVERY_TTL_S`)."""
        now = self.clock()
        if self._meta is not None and now - self._meta[0] < DISCOVERY_TTL_S:
            return self._meta[1]
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        doc = await self._get_json(url, "read the discovery document")
        try:
            meta = msgspec.convert(doc, ProviderMetadata)
        except msgspec.ValidationError as exc:
            raise self._unreachable("read the discovery document", f"{url}: {exc}") from None
        if meta.issuer != self.issuer:
            raise self._unreachable("read the discovery document",
                                    f"it names the issuer {meta.issuer!r}, not {self.issuer!r}: set "
                                    "auth.oidc.issuer to exactly the provider's issuer")
        self._meta = (now, meta)
        return meta

    async def keys(self, want_kid: str | None = None) -> KeySet:
        """The provider's JWKS; refetched once when it lacks `want_kid` (rate-limited)."""
        now = self.clock()
        cached = self._keys
        if cached is not None:
            stale = want_kid is not None and not any(k.kid == want_kid for k in cached[1])
            if not stale or now - cached[0] < self.jwks_refetch_s:
                return cached[1]
        meta = await self.metadata()
        doc = await self._get_json(meta.jwks_uri, "read the signing keys (JWKS)")
        try:
            keys = KeySet.import_key_set({"keys": [k for k in doc.get("keys", []) if k.get("use", "sig") == "sig"]})
        except Exception as exc:  # joserfc raises several kinds for a key it cannot read
            raise self._unreachable("read the signing keys (JWKS)", exc) from None
        self.jwks_fetches += 1
        self._keys = (now, keys)
        return keys

    # -- the sign-in -------------------------------------------------------------------
    async def authorization_url(self, flow: Flow, redirect_uri: str) -> str:
        """Where the browser goes to sign in: the code flow with PKCE (S256), state and nonce."""
        meta = await self.metadata()
        return prepare_grant_uri(meta.authorization_endpoint, client_id=self.settings.client_id,
                                 response_type="code", redirect_uri=redirect_uri,
                                 scope=" ".join(self.settings.scopes), state=flow.state, nonce=flow.nonce,
                                 code_challenge=create_s256_code_challenge(flow.verifier),
                                 code_challenge_method="S256")

    def client_secret(self) -> str:
        try:
            return resolve_env(self.settings.client_secret, "auth.oidc.client_secret")
        except SourceConfigError as exc:
            raise ProviderUnreachable(f"The server's single sign-on is misconfigured: {exc}. An admin must "
                                      "set it and restart.", "sso: client secret missing") from None

    async def exchange(self, code: str, redirect_uri: str, verifier: str | None) -> dict[str, Any]:
        """The token endpoint's answer to the authorization code (with the PKCE verifier)."""
        if not verifier:  # every code DataDesk asked for was bound to a verifier (PKCE, S256)
            raise FlowRejected("This sign-in has no PKCE verifier, so its code is not exchanged: start again "
                               "from the login page.", "sso: no PKCE verifier")
        meta = await self.metadata()
        methods = meta.token_endpoint_auth_methods_supported
        method = "client_secret_post" if "client_secret_basic" not in methods and "client_secret_post" in methods \
            else "client_secret_basic"
        params: dict[str, Any] = {"code": code, "redirect_uri": redirect_uri, "code_verifier": verifier}
        try:
            async with AsyncOAuth2Client(client_id=self.settings.client_id, client_secret=self.client_secret(),
                                         token_endpoint_auth_method=method, timeout=self.timeout_s,
                                         verify=await tls_context()) as client:
                token = await client.fetch_token(meta.token_endpoint, grant_type="authorization_code", **params)
        except OAuthError as exc:
            hint = (" (the code was already used or has expired, or the PKCE verifier or redirect URI does "
                    "not match the ones it was issued for)" if exc.error == "invalid_grant" else "")
            raise ProviderRefused(f"The sign-in provider refused the sign-in code: {exc.error}"
                                  f"{': ' + str(exc.description)[:300] if exc.description else ''}{hint}. "
                                  "Start again from the login page.", f"sso: code refused ({exc.error})") from None
        except SSOError:
            raise
        except HTTP_ERRORS as exc:
            raise self._unreachable("exchange the sign-in code", exc) from None
        if not isinstance(token.get("id_token"), str):
            raise ProviderRefused("The sign-in provider answered without an ID token: check that the scopes "
                                  "(auth.oidc.scopes) include \"openid\".", "sso: no id token")
        return dict(token)

    async def verify(self, raw: str, nonce: str) -> dict[str, Any]:
        """The claims of an ID token that passes every check (idtoken.py), its nonce spent."""
        meta = await self.metadata()
        kid = token_header(raw).get("kid")
        keys = await self.keys(kid if isinstance(kid, str) else None)  # an unknown kid: refetched once
        claims = check_signature(raw, keys, meta.id_token_signing_alg_values_supported)
        check_claims(claims, issuer=self.issuer, client_id=self.settings.client_id, nonce=nonce,
                     now=self.clock(), leeway=LEEWAY_S)
        if not self.nonces.spend(nonce):
            raise TokenRejected("This sign-in response was already used once (a replayed ID token): "
                                "start again from the login page.", "sso: replayed id token")
        return claims

    async def userinfo(self, access_token: str) -> dict[str, Any]:
        """The userinfo endpoint's claims ({} when the provider has none)."""
        meta = await self.metadata()
        if not meta.userinfo_endpoint:
            return {}
        return await self._get_json(meta.userinfo_endpoint, "read the user's claims (userinfo)",
                                    headers={"Authorization": f"Bearer {access_token}"})

    async def end_session_url(self, id_token: str | None, post_logout_redirect_uri: str) -> str | None:
        """The provider's RP-initiated logout URL (OIDC RP-Initiated Logout 1.0), or None when it
        has no `end_session_endpoint`."""
        meta = await self.metadata()
        if not meta.end_session_endpoint:
            return None
        params = {"client_id": self.settings.client_id, "post_logout_redirect_uri": post_logout_redirect_uri}
        if id_token:
            params["id_token_hint"] = id_token
        sep = "&" if "?" in meta.end_session_endpoint else "?"
        return meta.end_session_endpoint + sep + urlencode(params)
