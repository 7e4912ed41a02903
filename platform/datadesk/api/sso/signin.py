"""`SSOSignIn`: a provider's return (code + this browser's flow) -> a checked, synced user.

The steps, each of which refuses with its own `SSOError` (errors.py):
1. the code is exchanged with the PKCE verifier (`OIDCClient.exchange`);
2. the ID token passes every check and its nonce is spent (`OIDCClient.verify`);
3. claims the ID token leaves out (the user name's or the groups' claim) are read from userinfo,
   only when its `sub` is the token's (OIDC Core 5.3.2);
4. the user name and groups come from the claims, the grants from the mapped groups (grants.py);
   no mapped group, or groups that grant no workspace, is refused with a page that says so;
5. `Users.sync_sso` creates the user at the first sign-in, or replaces their workspaces and
   permissions with what the groups grant now; a name bound to another provider account, or a
   revoked user, is refused.
"""

from __future__ import annotations

from typing import Any

import msgspec

from datadesk.api.sso.errors import SignInRefused
from datadesk.api.sso.flow import Flow
from datadesk.api.sso.grants import grants_for, groups_of, no_group_refusal, username_of
from datadesk.api.sso.oidc import OIDCClient
from datadesk.domain.users import User
from datadesk.store.interfaces.users import UserError, Users


class SignedIn(msgspec.Struct):
    """A completed single sign-on."""

    user: User
    id_token: str  # kept for the provider's logout (`id_token_hint`)
    groups: list[str]  # the mapped groups that let the user in


class SSOSignIn:
    """The sign-in service: holds the provider client and the user store."""

    def __init__(self, client: OIDCClient, users: Users) -> None:
        self.client = client
        self.users = users
        self.settings = client.settings

    async def complete(self, code: str, flow: Flow, redirect_uri: str) -> SignedIn:
        tokens = await self.client.exchange(code, redirect_uri, flow.verifier)
        raw = tokens["id_token"]
        claims = await self.client.verify(raw, flow.nonce)
        claims = await self._with_userinfo(claims, tokens.get("access_token"))
        name = username_of(claims, self.settings.username_claim)
        groups = groups_of(claims, self.settings.groups_claim)
        grants = grants_for(groups, self.settings.groups)
        if not grants.groups:
            raise no_group_refusal(name, groups, self.settings.groups_claim)
        if not grants.workspaces:
            raise SignInRefused(f"You signed in as {name}; your groups ({', '.join(grants.groups)}) are let in "
                                "but grant no workspace. Ask your DataDesk admin to list the workspaces of "
                                "your group in auth.oidc.groups.", "sso: groups grant no workspace", user=name)
        try:
            user = self.users.sync_sso(name, grants.workspaces, grants.permissions,
                                       issuer=str(claims["iss"]), subject=str(claims["sub"]))
        except UserError as exc:
            raise SignInRefused(f"DataDesk cannot sign you in as {name}: {exc}. If this is your name, ask your "
                                "DataDesk admin to look at this user.", "sso: name bound to another account",
                                user=name) from None
        if user.revoked:
            raise SignInRefused(f"The DataDesk user {name} has been revoked by an admin, so signing in at the "
                                "provider does not let you in. Ask your DataDesk admin.",
                                "sso: revoked user", user=name)
        return SignedIn(user=user, id_token=raw, groups=grants.groups)

    async def _with_userinfo(self, claims: dict[str, Any], access_token: Any) -> dict[str, Any]:
        """The ID token's claims, plus userinfo's for the name or groups it lacks."""
        wanted = (self.settings.username_claim, self.settings.groups_claim)
        if all(w in claims for w in wanted) or not isinstance(access_token, str):
            return claims
        info = await self.client.userinfo(access_token)
        if info.get("sub") != claims.get("sub"):
            return claims  # another subject's claims are never used
        return {**info, **claims}
