"""`Users` conformance on both sets (users.json + sessions.json; PostgreSQL): every method, bad
inputs, revocation, expiry, secrets stored only as hashes, two stores (two hosts) seeing each
other's writes at once, and one login code redeemed from two threads at once (exactly one wins).
The people extension too: edits, restore, one token revoked, single sign-on binding, last login,
invitations (one-time, expiring, revocable; one redeemed from two hosts at once: one user).
Also the shared secret: one CSRF key for every host from `server.secret_key`."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from datadesk.domain.users import User
from datadesk.store.interfaces.users import UserError, Users, credential_account, secret_hash
from datadesk.store.layout import Layout
from datadesk.store.users import UserStore
from tests.cluster import sets

pytestmark = pytest.mark.cluster


class Hosts(sets.Hosts):
    """Makes `Users` of one set; `store(new_host=True)` is another host (cluster: its own pool)."""

    def __init__(self, kind: str, request, tmp_path: Path) -> None:
        super().__init__(kind, request, tmp_path)
        self.home = tmp_path

    def store(self, new_host: bool = False) -> Users:
        if self.kind == "embedded":
            return UserStore(Layout(self.home))
        from datadesk.cluster.users import build_users

        return build_users(self.database("host-b", max_size=4) if new_host else self.db)

    def stored_text(self) -> str:
        """Everything the set has stored, as text (to prove no secret is kept in clear)."""
        if self.kind == "embedded":
            return "".join(p.read_text() for p in sorted(self.home.glob("*.json")))
        with self.db.connection() as conn:
            rows = [conn.execute(f"SELECT * FROM {t}").fetchall()
                    for t in ("users", "user_tokens", "login_codes", "sessions", "user_logins", "invitations")]
        return repr(rows)


hosts = sets.hosts_fixture(Hosts)


@pytest.fixture
def users(hosts) -> Users:
    return hosts.store()


def test_both_sets_are_users(hosts) -> None:
    assert isinstance(hosts.store(), Users) and isinstance(hosts.store(new_host=True), Users)


def test_add_get_list_and_tokens(users) -> None:
    assert users.list() == [] and users.get("alice") is None
    alice, token = users.add("alice", ["demo", "sales", "demo"], ["memory", "code_execution"])
    assert isinstance(alice, User) and alice.id == alice.name == "alice"
    assert alice.workspaces == ["demo", "sales"] and alice.permissions == ["code_execution", "memory"]
    assert alice.created > 0 and not alice.revoked and len(alice.tokens) == 1
    assert token.startswith("ddt_alice.") and credential_account(token) == "alice"
    users.add("bob", ["demo"])
    assert [u.id for u in users.list()] == ["alice", "bob"]
    got = users.get("alice")
    assert got.workspaces == alice.workspaces and got.permissions == alice.permissions
    assert got.tokens[0].hash == secret_hash(token) and got.can("memory") and not got.can("admin")
    assert users.by_token(token).id == "alice"
    extra = users.new_token("alice")
    assert extra != token and users.by_token(extra).id == "alice" and users.by_token(token).id == "alice"
    assert len(users.get("alice").tokens) == 2
    assert users.get("bob").permissions == []


def test_bad_inputs_are_refused_naming_what_was_wrong(users) -> None:
    users.add("alice", ["demo"])
    with pytest.raises(UserError, match="already exists"):
        users.add("alice", ["sales"])
    with pytest.raises(UserError, match="unknown permission"):
        users.add("bob", ["demo"], ["root"])
    with pytest.raises(UserError, match="at least one workspace"):
        users.add("bob", [])
    with pytest.raises(ValueError, match="user name"):
        users.add("../bob", ["demo"])
    with pytest.raises(ValueError, match="workspace"):
        users.add("bob", ["../etc"])
    for call in (lambda: users.revoke("nobody"), lambda: users.new_token("nobody"),
                 lambda: users.new_login_code("nobody", 60), lambda: users.delete("nobody")):
        with pytest.raises(UserError, match="no user named 'nobody'"):
            call()
    assert [u.id for u in users.list()] == ["alice"]  # nothing half-made by a refused add
    for bad in ("", "ddt_alice.guess", "ddt_oldstyle", "x" * 5000, "\u00e9\u0000"):
        assert users.by_token(bad) is None and users.by_session(bad) is None
        assert users.peek_login_code(bad) is None and users.redeem_login_code(bad) is None
    users.end_session("not-a-session")  # unknown ids are ignored


def test_revoking_stops_every_token_code_and_session_at_once(users) -> None:
    _, token = users.add("alice", ["demo"])
    users.add("bob", ["demo"])
    extra = users.new_token("alice")
    code = users.new_login_code("alice", 600)
    sid = users.new_session("alice", 600)
    bob_sid = users.new_session("bob", 600)
    assert users.by_session(sid).id == "alice" and users.peek_login_code(code).id == "alice"
    users.revoke("alice")
    assert users.by_token(token) is None and users.by_token(extra) is None
    assert users.by_session(sid) is None and users.peek_login_code(code) is None
    assert users.redeem_login_code(code) is None
    revoked = users.get("alice")
    assert revoked.revoked and all(t.revoked for t in revoked.tokens)
    assert [u.id for u in users.list()] == ["alice", "bob"]  # still listed, as revoked
    assert users.by_session(bob_sid).id == "bob"  # other users untouched
    assert users.by_token(users.new_token("alice")) is None  # a new token of a revoked user: no entry


def test_login_codes_are_one_time_expiring_and_replace_earlier_ones(users) -> None:
    users.add("alice", ["demo"])
    users.add("bob", ["demo"])
    code = users.new_login_code("alice", 60)
    assert code.startswith("alice.") and credential_account(code) == "alice"
    assert users.peek_login_code(code).id == "alice" and users.peek_login_code(code).id == "alice"  # not consumed
    assert users.redeem_login_code(code).id == "alice"
    assert users.redeem_login_code(code) is None and users.peek_login_code(code) is None
    first, second = users.new_login_code("alice", 600), users.new_login_code("alice", 600)
    bobs = users.new_login_code("bob", 600)
    assert users.peek_login_code(first) is None and users.redeem_login_code(first) is None
    assert users.peek_login_code(second).id == "alice" and users.peek_login_code(bobs).id == "bob"
    assert users.redeem_login_code(users.new_login_code("bob", -1)) is None  # born expired
    short = users.new_login_code("bob", 0.3)
    assert users.peek_login_code(short).id == "bob"
    time.sleep(0.5)
    assert users.peek_login_code(short) is None and users.redeem_login_code(short) is None


def test_sessions_expire_end_and_are_swept(hosts, users) -> None:
    users.add("alice", ["demo"])
    sid = users.new_session("alice", 600)
    assert users.by_session(sid).id == "alice"
    users.end_session(sid)
    assert users.by_session(sid) is None
    short = users.new_session("alice", 0.3)
    assert users.by_session(short).id == "alice"
    time.sleep(0.5)
    assert users.by_session(short) is None
    assert secret_hash(short) in hosts.stored_text()  # refused, not yet swept
    users.new_session("alice", 600)
    assert secret_hash(short) not in hosts.stored_text()  # swept by the next write
    ghost = users.new_session("ghost", 600)  # nobody: an id that authenticates no one
    assert users.by_session(ghost) is None


def test_logins_are_recorded(users) -> None:
    users.add("alice", ["demo"])
    users.add("bob", ["demo"])
    assert not users.has_logged_in("alice")
    users.record_login("alice")
    users.record_login("alice")
    assert users.has_logged_in("alice") and not users.has_logged_in("bob")


def test_delete_removes_the_user_and_its_credentials(users) -> None:
    _, token = users.add("alice", ["demo"])
    users.add("bob", ["demo"])
    sid, code = users.new_session("alice", 600), users.new_login_code("alice", 600)
    assert isinstance(users.delete("alice"), list)
    assert users.get("alice") is None and [u.id for u in users.list()] == ["bob"]
    assert users.by_token(token) is None and users.by_session(sid) is None and users.peek_login_code(code) is None
    _, again = users.add("alice", ["sales"])  # the name is free again, with fresh credentials only
    assert users.by_token(again).workspaces == ["sales"] and users.by_token(token) is None


def test_secrets_are_stored_only_as_hashes(hosts, users) -> None:
    _, token = users.add("alice", ["demo"])
    extra, code, sid = users.new_token("alice"), users.new_login_code("alice", 600), users.new_session("alice", 600)
    text = hosts.stored_text()
    for secret in (token, extra, code, sid):
        assert secret not in text and secret.rsplit(".", 1)[-1] not in text
        assert secret_hash(secret) in text


def test_two_hosts_see_each_others_writes_at_once(hosts) -> None:
    a, b = hosts.store(), hosts.store(new_host=True)
    _, token = a.add("alice", ["demo"])
    assert b.by_token(token).id == "alice" and [u.id for u in b.list()] == ["alice"]
    sid = b.new_session("alice", 600)
    assert a.by_session(sid).id == "alice"
    code = a.new_login_code("alice", 600)
    assert b.redeem_login_code(code).id == "alice" and a.redeem_login_code(code) is None
    a.record_login("alice")
    assert b.has_logged_in("alice")
    b.revoke("alice")
    assert a.by_session(sid) is None and a.by_token(token) is None and a.get("alice").revoked
    a.add("bob", ["demo"])
    with pytest.raises(UserError, match="already exists"):
        b.add("bob", ["demo"])  # names are unique across hosts
    b.delete("bob")
    assert a.get("bob") is None


def test_one_code_redeemed_from_two_hosts_at_once_has_exactly_one_winner(hosts) -> None:
    a, b = hosts.store(), hosts.store(new_host=True)
    a.add("alice", ["demo"])
    for _ in range(10):
        code = a.new_login_code("alice", 600)
        start = threading.Barrier(2)
        won: list[User | None] = []

        def redeem(store: Users) -> None:
            start.wait()
            won.append(store.redeem_login_code(code))

        threads = [threading.Thread(target=redeem, args=(s,)) for s in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(w is None for w in won) == [False, True], won


def test_two_hosts_making_codes_at_once_leave_one_live(hosts) -> None:
    a, b = hosts.store(), hosts.store(new_host=True)
    a.add("alice", ["demo"])
    start = threading.Barrier(2)
    codes: list[str] = []

    def make(store: Users) -> None:
        start.wait()
        codes.append(store.new_login_code("alice", 600))

    threads = [threading.Thread(target=make, args=(s,)) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sum(a.peek_login_code(c) is not None for c in codes) == 1  # the later one voided the earlier


# -- people: edits, restore, tokens, last login --------------------------------------------------
def test_update_replaces_grants_and_refuses_bad_ones(hosts, users) -> None:
    _, token = users.add("alice", ["demo"], ["memory"])
    other = hosts.store(new_host=True)
    got = users.update("alice", workspaces=["sales", "demo", "sales"])
    assert got.workspaces == ["sales", "demo"] and got.permissions == ["memory"]  # None: kept
    got = users.update("alice", permissions=["admin", "code_execution"])
    assert got.workspaces == ["sales", "demo"] and got.permissions == ["admin", "code_execution"]
    seen = other.by_token(token)  # another host sees the edit at the next request
    assert seen.workspaces == ["sales", "demo"] and seen.can("admin")
    assert users.update("alice").workspaces == ["sales", "demo"]  # nothing asked: unchanged
    with pytest.raises(UserError, match="no user named 'nobody'"):
        users.update("nobody", workspaces=["demo"])
    with pytest.raises(UserError, match="at least one workspace"):
        users.update("alice", workspaces=[])
    with pytest.raises(UserError, match="unknown permission"):
        users.update("alice", permissions=["root"])
    with pytest.raises(ValueError, match="workspace"):
        users.update("alice", workspaces=["../etc"])
    assert users.get("alice").workspaces == ["sales", "demo"]  # refused edits change nothing


def test_restore_re_enables_a_user_but_not_its_old_tokens(users) -> None:
    _, token = users.add("alice", ["demo"])
    users.revoke("alice")
    users.restore("alice")
    alice = users.get("alice")
    assert not alice.revoked and all(t.revoked for t in alice.tokens)
    assert users.by_token(token) is None  # the old token stays revoked
    fresh = users.new_token("alice")
    assert users.by_token(fresh).id == "alice"
    sid = users.new_session("alice", 600)
    assert users.by_session(sid).id == "alice"
    users.restore("alice")  # restoring an active user: nothing changes
    assert users.by_token(fresh).id == "alice"
    with pytest.raises(UserError, match="no user named 'nobody'"):
        users.restore("nobody")


def test_one_token_is_revoked_by_its_id(users) -> None:
    _, first = users.add("alice", ["demo"])
    second = users.new_token("alice")
    users.add("bob", ["demo"])
    ids = [t.id for t in users.get("alice").tokens]
    users.revoke_token("alice", ids[0])
    assert users.by_token(first) is None and users.by_token(second).id == "alice"
    assert [t.revoked for t in users.get("alice").tokens] == [True, False]
    with pytest.raises(UserError, match="has no token"):
        users.revoke_token("alice", "k-unknown")
    with pytest.raises(UserError, match="has no token"):
        users.revoke_token("bob", ids[1])  # another user's token id: not theirs to name
    with pytest.raises(UserError, match="no user named 'nobody'"):
        users.revoke_token("nobody", ids[1])
    assert users.by_token(second).id == "alice"


def test_last_login_is_the_time_of_the_latest(users) -> None:
    users.add("alice", ["demo"])
    users.add("bob", ["demo"])
    assert users.last_login("alice") is None and users.last_login("nobody") is None
    before = time.time()
    users.record_login("alice")
    first = users.last_login("alice")
    assert first is not None and abs(first - before) < 5, (first, before)
    time.sleep(0.02)
    users.record_login("alice")
    assert users.last_login("alice") > first and users.last_login("bob") is None


# -- people: single sign-on ------------------------------------------------------------------------
ISS = "https://idp.example.org"


def test_sso_creates_then_replaces_grants_at_each_sign_in(hosts, users) -> None:
    first = users.sync_sso("carol", ["sales"], ["memory"], issuer=ISS, subject="sub-1")
    assert first.id == "carol" and first.workspaces == ["sales"] and first.permissions == ["memory"]
    assert first.tokens == [] and (first.sso_issuer, first.sso_subject) == (ISS, "sub-1")
    again = hosts.store(new_host=True).sync_sso("carol", ["demo"], [], issuer=ISS, subject="sub-1")
    assert again.workspaces == ["demo"] and again.permissions == []  # a group lost: its workspace gone
    assert users.get("carol").workspaces == ["demo"] and [u.id for u in users.list()] == ["carol"]


def test_sso_refuses_another_subject_for_a_bound_name(users) -> None:
    users.sync_sso("carol", ["sales"], [], issuer=ISS, subject="sub-1")
    for iss, sub in ((ISS, "sub-2"), ("https://other.example.org", "sub-1")):
        with pytest.raises(UserError, match="belongs to another single sign-on account"):
            users.sync_sso("carol", ["sales", "demo"], ["admin"], issuer=iss, subject=sub)
    carol = users.get("carol")
    assert carol.workspaces == ["sales"] and carol.permissions == [] and carol.sso_subject == "sub-1"


def test_sso_binds_a_pre_created_user_and_keeps_a_revoked_one_revoked(users) -> None:
    _, token = users.add("dave", ["demo"])
    dave = users.sync_sso("dave", ["sales"], ["memory"], issuer=ISS, subject="sub-d")
    assert dave.workspaces == ["sales"] and (dave.sso_issuer, dave.sso_subject) == (ISS, "sub-d")
    assert users.by_token(token).id == "dave"  # the admin's token keeps working
    with pytest.raises(UserError, match="another single sign-on account"):
        users.sync_sso("dave", ["sales"], [], issuer=ISS, subject="sub-x")
    users.revoke("dave")
    still = users.sync_sso("dave", ["demo", "sales"], ["admin"], issuer=ISS, subject="sub-d")
    assert still.revoked and still.workspaces == ["sales"] and still.permissions == ["memory"]
    with pytest.raises(UserError, match="at least one workspace"):
        users.sync_sso("erin", [], [], issuer=ISS, subject="sub-e")
    with pytest.raises(UserError, match="unknown permission"):
        users.sync_sso("erin", ["demo"], ["root"], issuer=ISS, subject="sub-e")
    with pytest.raises(ValueError, match="user name"):
        users.sync_sso("../erin", ["demo"], [], issuer=ISS, subject="sub-e")
    assert users.get("erin") is None


def test_two_first_sso_sign_ins_at_once_make_one_user(hosts) -> None:
    a, b = hosts.store(), hosts.store(new_host=True)
    for round_ in range(5):
        name = f"sso{round_}"
        start = threading.Barrier(2)
        got: list[object] = []

        def sign_in(store: Users, sub: str) -> None:
            start.wait()
            try:
                got.append(store.sync_sso(name, ["demo"], [], issuer=ISS, subject=sub))
            except UserError as exc:
                got.append(exc)

        threads = [threading.Thread(target=sign_in, args=(s, sub)) for s, sub in ((a, "one"), (b, "two"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        users_made = [g for g in got if isinstance(g, User)]
        assert len(got) == 2 and len(users_made) == 1, got  # the other subject is refused, not merged
        assert a.get(name).sso_subject == users_made[0].sso_subject


# -- people: invitations ---------------------------------------------------------------------------
def test_an_invitation_is_redeemed_once_into_a_user_with_its_grants(hosts, users) -> None:
    users.add("admin", ["demo"], ["admin"])
    code, inv = users.new_invitation(["sales", "demo"], ["memory"], 600, created_by="admin")
    assert code.startswith("ddi_") and inv.id and inv.workspaces == ["sales", "demo"]
    assert inv.permissions == ["memory"] and inv.created_by == "admin" and inv.name is None
    assert inv.used_by is None and not inv.revoked and 590 < inv.expires - inv.created <= 601
    assert inv.state(time.time()) == "open"
    assert users.peek_invitation(code).id == inv.id and users.peek_invitation("ddi_guess") is None
    other = hosts.store(new_host=True)
    frank = other.redeem_invitation(code, "frank")
    assert frank.id == "frank" and frank.workspaces == ["sales", "demo"] and frank.permissions == ["memory"]
    assert frank.tokens == [] and not frank.revoked and users.get("frank") is not None
    used = users.peek_invitation(code)
    assert used.used_by == "frank" and used.used_at is not None and used.state(time.time()) == "used"
    with pytest.raises(UserError, match="already been used"):
        users.redeem_invitation(code, "gina")
    assert users.get("gina") is None
    text = hosts.stored_text()
    assert code not in text and code[4:] not in text and secret_hash(code) in text


def test_invitations_are_listed_newest_first_and_revocable(users) -> None:
    first_code, first = users.new_invitation(["demo"], [], 600, created_by="admin")
    _, second = users.new_invitation(["sales"], ["admin"], 600, created_by="admin", name="hana")
    assert [i.id for i in users.invitations()] == [second.id, first.id]
    assert users.invitations()[0].name == "hana"
    users.revoke_invitation(first.id)
    assert users.invitations()[1].revoked and users.peek_invitation(first_code).state(time.time()) == "revoked"
    with pytest.raises(UserError, match="was revoked"):
        users.redeem_invitation(first_code, "ivan")
    with pytest.raises(UserError, match="no invitation 'inv_nope'"):
        users.revoke_invitation("inv_nope")
    assert users.get("ivan") is None


def test_invitations_expire_and_bad_codes_are_refused(users) -> None:
    code, _ = users.new_invitation(["demo"], [], 0.3, created_by="admin")
    time.sleep(0.5)
    assert users.peek_invitation(code).state(time.time()) == "expired"
    with pytest.raises(UserError, match="has expired"):
        users.redeem_invitation(code, "jack")
    for bad in ("", "ddi_guess", "x" * 5000, "\u00e9\u0000"):
        with pytest.raises(UserError, match="not valid"):
            users.redeem_invitation(bad, "jack")
        assert users.peek_invitation(bad) is None
    assert users.list() == []


def test_an_invitation_with_a_fixed_name_and_taken_names(users) -> None:
    users.add("kim", ["demo"])
    with pytest.raises(UserError, match="'kim' already exists"):
        users.new_invitation(["demo"], [], 600, created_by="admin", name="kim")
    for bad in (([], []), (["demo"], ["root"])):
        with pytest.raises(UserError):
            users.new_invitation(*bad, 600, created_by="admin")
    with pytest.raises(ValueError, match="user name"):
        users.new_invitation(["demo"], [], 600, created_by="admin", name="../x")
    assert users.invitations() == []
    code, _ = users.new_invitation(["sales"], [], 600, created_by="admin", name="lee")
    with pytest.raises(UserError, match="is for the user name 'lee'"):
        users.redeem_invitation(code, "mallory")
    assert users.redeem_invitation(code, None).id == "lee"
    open_code, _ = users.new_invitation(["demo"], [], 600, created_by="admin")
    with pytest.raises(UserError, match="choose a user name"):
        users.redeem_invitation(open_code, "")
    with pytest.raises(ValueError, match="user name"):
        users.redeem_invitation(open_code, "../etc")
    with pytest.raises(UserError, match="'kim' is taken"):
        users.redeem_invitation(open_code, "kim")
    assert users.get("kim").workspaces == ["demo"]  # the taken name's user untouched
    assert users.redeem_invitation(open_code, "moe").workspaces == ["demo"]  # still open after those


def test_one_invitation_redeemed_from_two_hosts_at_once_makes_one_user(hosts) -> None:
    a, b = hosts.store(), hosts.store(new_host=True)
    for round_ in range(10):
        code, _ = a.new_invitation(["demo"], [], 600, created_by="admin")
        start = threading.Barrier(2)
        got: list[object] = []

        def redeem(store: Users, name: str) -> None:
            start.wait()
            try:
                got.append(store.redeem_invitation(code, name))
            except UserError as exc:
                got.append(exc)

        names = (f"a{round_}", f"b{round_}")
        threads = [threading.Thread(target=redeem, args=(s, n)) for s, n in zip((a, b), names)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        made = [g for g in got if isinstance(g, User)]
        refused = [g for g in got if isinstance(g, UserError)]
        assert len(made) == 1 and len(refused) == 1 and "already been used" in str(refused[0]), got
        assert sum(a.get(n) is not None for n in names) == 1
        assert a.peek_invitation(code).used_by == made[0].id


def test_an_old_users_file_stays_readable(tmp_path) -> None:
    """A users.json written before invitations and SSO loads as it was, and keeps loading."""
    import json

    (tmp_path / "users.json").write_text(json.dumps({"version": 1, "users": {"old": {
        "id": "old", "name": "old", "workspaces": ["demo"], "permissions": ["admin"], "created": 1.0,
        "tokens": [{"id": "k1", "hash": secret_hash("ddt_old.x"), "created": 1.0}]}},
        "login_codes": [], "logins": {"old": 2.0}}))
    store = UserStore(Layout(tmp_path))
    old = store.get("old")
    assert old.sso_subject is None and store.by_token("ddt_old.x").id == "old" and store.last_login("old") == 2.0
    assert store.invitations() == []
    store.new_invitation(["demo"], [], 600, created_by="old")
    assert "sso_subject" not in (tmp_path / "users.json").read_text()  # unset fields are not written
    assert UserStore(Layout(tmp_path)).get("old").can("admin")


# -- the shared secret ---------------------------------------------------------------------
SECRET = "s3cret-" + "x" * 40


def test_one_secret_gives_every_host_the_same_key_without_touching_the_home(tmp_path) -> None:
    from datadesk.api.guards.security import csrf_token, derive_key, load_key

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    key = load_key(a, SECRET)
    assert key == load_key(b, SECRET) and len(key) == 32
    assert SECRET.encode() not in key and not (a / "csrf.key").exists() and not (b / "csrf.key").exists()
    assert csrf_token(key, "sid") == csrf_token(load_key(b, SECRET), "sid")
    assert load_key(a, SECRET + "y") != key and derive_key(SECRET, "other") != key
    own = load_key(a)  # no secret: the home's own key, as before
    assert own != key and (a / "csrf.key").read_bytes() == own and load_key(a, "") == own and load_key(a, None) == own


def test_a_short_secret_is_refused_without_showing_it(tmp_path) -> None:
    from datadesk.api.guards.security import load_key

    with pytest.raises(ValueError, match="server.secret_key is too short") as info:
        load_key(tmp_path, "hunter2-hunter2")
    assert "hunter2" not in str(info.value)
    with pytest.raises(TypeError, match="must be a string"):
        load_key(tmp_path, 12345)  # type: ignore[arg-type]


# -- two app processes behind one database --------------------------------------------------------
def test_two_apps_share_users_sessions_csrf_and_login_limits(tmp_path, cluster_db, cluster_db_url) -> None:
    """Two apps with separate homes, one database and one secret: a session made via one works
    via the other (the CSRF token too), and failed logins via both count together."""
    from litestar.testing import TestClient

    from datadesk.cluster.counters import build_counters
    from datadesk.cluster.database import Database
    from datadesk.cluster.users import build_users
    from datadesk.llm.scripted import ScriptedModel
    from tests.conftest import make_harness

    other = Database(cluster_db_url, max_size=4, name="host-b")
    apps = []
    for name, db in (("a", cluster_db), ("b", other)):
        h = make_harness(tmp_path / name, ScriptedModel(then="ok"), server={"secret_key": SECRET},
                         auth={"login_attempts_per_minute": 3})
        h.rt.users, h.rt.counters = build_users(db), build_counters(db)
        apps.append(h.app())
    try:
        _, token = build_users(cluster_db).add("dana", ["demo"])
        with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
            r = b.post("/api/login", json={"token": token})
            assert r.status_code == 200, r.text
            csrf, sid = r.json()["csrf"], r.cookies["datadesk_session"]
            a.cookies.set("datadesk_session", sid)
            me = a.get("/api/me")
            assert me.status_code == 200 and me.json()["csrf"] == csrf and me.json()["id"] == "dana"
            assert a.post("/api/threads", json={}, headers={"X-CSRF-Token": csrf}).status_code == 201
            assert a.post("/api/threads", json={}, headers={"X-CSRF-Token": "0" * 40}).status_code == 403
            assert b.post("/api/logout", headers={"X-CSRF-Token": csrf}).status_code == 200
            assert a.get("/api/me").status_code == 401  # logged out via B: gone via A at once
            statuses = [c.post("/api/login", json={"token": "ddt_dana.guess"}).status_code for c in (a, b, a, b)]
            assert statuses == [401, 401, 401, 429]  # 3 failures a minute for both apps together
            assert a.post("/api/login", json={"token": token}).status_code == 429
    finally:
        other.close()


def test_a_file_homes_users_and_sessions_are_copied_as_hashes(tmp_path, cluster_db) -> None:
    """What `datadesk migrate` copies: users with their token hashes, revocation, last logins and
    live sessions; the clear credentials handed out by the file home keep working. Twice is once."""
    import msgspec

    from datadesk.cluster.users import build_users

    files = UserStore(Layout(tmp_path))
    _, token = files.add("alice", ["demo", "sales"], ["memory"])
    _, bobs = files.add("bob", ["demo"])
    files.revoke("bob")
    files.record_login("alice")
    sid, old = files.new_session("alice", 600), files.new_session("alice", 0.01)
    time.sleep(0.05)
    pg = build_users(cluster_db)
    sessions = msgspec.json.decode((tmp_path / "sessions.json").read_bytes())
    for _ in range(2):
        for user in files.list():
            pg.import_user(user, 1.0 if files.has_logged_in(user.id) else None)
        copied = [pg.import_session(h, s["user"], s["created"], s["expires"]) for h, s in sessions.items()]
    assert sorted(copied) == [False, True]  # the expired one is not copied
    assert pg.by_token(token).workspaces == ["demo", "sales"] and pg.by_token(bobs) is None
    assert pg.by_session(sid).id == "alice" and pg.by_session(old) is None
    assert pg.has_logged_in("alice") and not pg.has_logged_in("bob") and pg.get("bob").revoked
    assert [u.id for u in pg.list()] == ["alice", "bob"] and len(pg.get("alice").tokens) == 1
