"""From a sign-in's claims to a DataDesk user: its name, its groups, what they grant.

- the name is the `auth.oidc.username_claim` claim, which must be a DataDesk id
  (`[A-Za-z0-9_-]{1,64}`, domain/ids.py): a missing or other-shaped one is refused by name,
  never turned into something else (two people's e-mail addresses must not fold into one user);
- the groups are the `auth.oidc.groups_claim` claim: a list of strings (or one string); a dotted
  name (`realm_access.roles`) reaches into a nested object when no claim has the dotted name;
- the grants are the union over the user's groups that `[auth.oidc.groups."<group>"]` maps:
  their workspaces (in the order the settings list the groups) and the permissions
  `can_execute_code` -> "code_execution", `memory` -> "memory", `admin` -> "admin".
"""

from __future__ import annotations

from typing import Any

import msgspec

from datadesk.api.sso.errors import SignInRefused
from datadesk.domain.ids import check_id, InvalidId
from datadesk.settings import OIDCGroupGrant

PERMISSION_OF_FLAG = {"can_execute_code": "code_execution", "memory": "memory", "admin": "admin"}


class Grants(msgspec.Struct, frozen=True):
    """What a user's mapped groups grant, and which of their groups were mapped."""

    workspaces: list[str]
    permissions: list[str]
    groups: list[str]  # the user's groups that the settings map (in the settings' order)


def claim(claims: dict[str, Any], name: str) -> Any:
    """`claims[name]`, else a dotted path into nested objects (`realm_access.roles`), else None."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def username_of(claims: dict[str, Any], claim_name: str) -> str:
    """The DataDesk user name the claims give; `SignInRefused` naming the claim when they don't."""
    value = claim(claims, claim_name)
    if value is None or value == "":
        raise SignInRefused(f"The sign-in provider did not send the claim {claim_name!r} that names your "
                            "DataDesk user (auth.oidc.username_claim). An admin should add it at the provider "
                            "(and its scope to auth.oidc.scopes) or choose another claim.",
                            f"sso: no {claim_name[:40]} claim")
    try:
        return check_id(value, "user name")
    except InvalidId:
        shown = repr(value)[:80]
        raise SignInRefused(f"Your {claim_name!r} at the sign-in provider is {shown}, which is not a DataDesk "
                            "user name (letters, digits, '_' and '-', at most 64). An admin should set "
                            "auth.oidc.username_claim to a claim of that form, or map one at the provider.",
                            f"sso: bad {claim_name[:40]} claim") from None


def groups_of(claims: dict[str, Any], claim_name: str) -> list[str]:
    """The user's groups: the claim as a list of strings ([] when absent)."""
    value = claim(claims, claim_name)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(g, str) for g in value):
        return list(value)
    raise SignInRefused(f"The sign-in provider's {claim_name!r} claim is not a list of group names "
                        "(auth.oidc.groups_claim). An admin should check the claim at the provider.",
                        f"sso: bad {claim_name[:40]} claim")


def grants_for(groups: list[str], mapping: dict[str, OIDCGroupGrant]) -> Grants:
    """The union of what the mapped ones of `groups` grant."""
    mine = set(groups)
    matched = [g for g in mapping if g in mine]
    workspaces: dict[str, None] = {}
    perms: set[str] = set()
    for group in matched:
        grant = mapping[group]
        workspaces.update(dict.fromkeys(grant.workspaces))
        perms.update(p for flag, p in PERMISSION_OF_FLAG.items() if getattr(grant, flag))
    return Grants(workspaces=list(workspaces), permissions=sorted(perms), groups=matched)


def no_group_refusal(user: str, groups: list[str], claim_name: str) -> SignInRefused:
    """The page for a user none of whose groups DataDesk maps."""
    if groups:
        shown = ", ".join(repr(g) for g in groups[:10]) + (", ..." if len(groups) > 10 else "")
        said = f"none of your groups at the sign-in provider ({shown}) is one that DataDesk lets in"
    else:
        said = (f"the sign-in provider sent no groups for you (claim {claim_name!r}), and DataDesk lets "
                "people in by their groups")
    return SignInRefused(f"You signed in as {user}, but {said}. Ask your DataDesk admin to give your group "
                         "access, or your identity team to add you to a group that has it; then sign in again.",
                         "sso: not in a mapped group", user=user)
