"""The checks an ID token must pass before anyone is signed in (OpenID Connect Core 3.1.3.7).

`verify_id_token(raw, keys, ...)` is pure (the keys and the time are given), so each refusal
can be tested with a crafted token; `OIDCClient.verify` (oidc.py) feeds it the provider's
JWKS, refetches that once for an unknown key, and spends the nonce.

- signature: JWS with one of the provider's published keys (joserfc), an asymmetric algorithm
  the provider announces (never `none`, never an HMAC keyed by a shared secret);
- `iss`: exactly the configured issuer; `aud`: holds our client id; with several audiences,
  `azp` must be present, and `azp`, when present, must be our client id;
- `exp`: not past (with `LEEWAY_S` of clock skew); `iat`: present, not in the future, and
  not older than `MAX_AGE_S` (a sign-in's token is minutes old, never hours);
- `nonce`: the one this browser's attempt sent; `sub`: present.
Each failure is a `TokenRejected` whose message says which check and what to look at.
"""

from __future__ import annotations

import hmac
from typing import Any, Iterable

from joserfc import jwt
from joserfc import errors as jose_errors
from joserfc.jwk import KeySet
from joserfc.jws import extract_compact

from datadesk.api.sso.errors import TokenRejected, UnknownKey

ASYMMETRIC_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
LEEWAY_S = 60
MAX_AGE_S = 15 * 60


def token_header(raw: str) -> dict[str, Any]:
    """The JOSE header of a compact JWT; `TokenRejected` when it is not one."""
    try:
        return dict(extract_compact(raw.encode("ascii")).headers())
    except (jose_errors.JoseError, ValueError, UnicodeError):
        raise TokenRejected("The provider's ID token is not a well-formed signed JWT.",
                            "sso: malformed id token") from None


def check_signature(raw: str, keys: KeySet, algorithms: Iterable[str]) -> dict[str, Any]:
    """The token's claims once its signature verifies with one of `keys`."""
    allowed = [a for a in algorithms if a in ASYMMETRIC_ALGS] or ["RS256"]
    header = token_header(raw)
    alg = header.get("alg")
    if alg not in allowed:
        raise TokenRejected(f"The ID token is signed with {alg!r}, which DataDesk does not accept "
                            f"(accepted: {', '.join(allowed)}).", "sso: id token algorithm refused")
    kid = header.get("kid")
    if kid is not None and not any(k.kid == kid for k in keys):
        raise UnknownKey(f"The ID token is signed with a key ({str(kid)[:40]!r}) the provider does not "
                         "publish in its JWKS.", "sso: id token signed with an unknown key")
    try:
        if kid is None:  # a token naming no key: any of the provider's keys of that type may verify it
            return _without_kid(raw, keys, alg)
        return dict(jwt.decode(raw, keys, algorithms=[alg]).claims)
    except (jose_errors.BadSignatureError, jose_errors.InvalidKeyTypeError,
            jose_errors.UnsupportedKeyAlgorithmError):
        raise TokenRejected("The ID token's signature does not verify with the provider's published keys: "
                            "it is forged or was altered.", "sso: bad id token signature") from None
    except (jose_errors.InvalidKeyIdError, jose_errors.MissingKeyError):
        raise UnknownKey("The ID token names no key the provider publishes.",
                         "sso: id token signed with an unknown key") from None
    except (jose_errors.JoseError, ValueError):
        raise TokenRejected("The provider's ID token could not be read (bad encoding or claims).",
                            "sso: malformed id token") from None


def check_claims(claims: dict[str, Any], *, issuer: str, client_id: str, nonce: str, now: float,
                 leeway: float = LEEWAY_S, max_age: float = MAX_AGE_S) -> None:
    """The claim checks of OIDC Core 3.1.3.7 (see the module docstring)."""
    def no(message: str, reason: str) -> TokenRejected:
        return TokenRejected(message, f"sso: {reason}")

    if claims.get("iss") != issuer:
        raise no(f"The ID token was issued by {str(claims.get('iss'))[:120]!r}, not by the configured "
                 f"provider {issuer!r} (auth.oidc.issuer).", "wrong issuer")
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if client_id not in audiences:
        raise no(f"The ID token is meant for another application (audience {audiences!r}), not for "
                 f"DataDesk's client id {client_id!r} (auth.oidc.client_id).", "wrong audience")
    azp = claims.get("azp")
    if (len(audiences) > 1 and azp is None) or (azp is not None and azp != client_id):
        raise no(f"The ID token was issued to another party (azp {azp!r}), not to DataDesk's client id "
                 f"{client_id!r}.", "wrong authorized party")
    exp, iat = claims.get("exp"), claims.get("iat")
    if not _number(exp) or exp + leeway < now:
        raise no("The ID token has expired (or has no expiry): sign in again. If this repeats, check "
                 "that this server's clock is right.", "expired id token")
    if not _number(iat) or iat - leeway > now:
        raise no("The ID token has no issue time or was issued in the future: check the clocks of "
                 "this server and the provider.", "id token issued in the future")
    if iat + max_age < now:
        raise no(f"The ID token was issued {int(now - iat)} s ago, too long for a sign-in that just "
                 "happened: sign in again.", "stale id token")
    sent = claims.get("nonce")
    if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), nonce.encode()):
        raise no("The ID token does not belong to the sign-in this browser started (wrong nonce): "
                 "start again from the login page.", "wrong nonce")
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise no("The ID token names no subject (`sub`).", "id token without subject")


def verify_id_token(raw: str, keys: KeySet, *, issuer: str, client_id: str, nonce: str, now: float,
                    algorithms: Iterable[str] = ("RS256",), leeway: float = LEEWAY_S) -> dict[str, Any]:
    """The claims of an ID token that passes every check; `TokenRejected` (or `UnknownKey`)."""
    claims = check_signature(raw, keys, algorithms)
    check_claims(claims, issuer=issuer, client_id=client_id, nonce=nonce, now=now, leeway=leeway)
    return claims


def _without_kid(raw: str, keys: KeySet, alg: str) -> dict[str, Any]:
    for key in keys:
        try:
            return dict(jwt.decode(raw, key, algorithms=[alg]).claims)
        except (jose_errors.BadSignatureError, jose_errors.InvalidKeyTypeError,
                jose_errors.UnsupportedKeyAlgorithmError):
            continue
    raise jose_errors.BadSignatureError()


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
