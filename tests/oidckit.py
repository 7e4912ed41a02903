"""A real OpenID provider for tests: node-oidc-provider (tests/oidc/provider.mjs) on a free
127.0.0.1 port, in a temp dir, stopped by PID.

    npm install --prefix .oidc-provider --no-save --no-audit --no-fund oidc-provider@9.13.3

puts the package where `MODULE_DIR` looks (git-ignored). Without it, or without Node, the
`oidc_provider` fixture skips, or fails when `DATADESK_REQUIRE_OIDC=1` (CI).

`OIDCProvider` holds the provider process and the files it reads:
- accounts (`set_accounts`, `set_groups`): re-read at every sign-in, so a test changes a user's
  groups at the provider between two sign-ins;
- its signing keys, private JWKs made here (`rotate_keys` swaps in a new one; `sign` makes a
  token with the provider's own key, for the claims it would never issue itself);
- its test client, whose redirect URIs `register` sets (the app's port is known late);
- a request log (`requests`), to see that the browser reached the end-session endpoint.
`Browser` is a headless user agent over httpx (one cookie jar for the app and the provider):
it starts a sign-in at the app, signs in on the provider's form, and stops at the app's callback.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from html import unescape
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULE_DIR = ROOT / ".oidc-provider" / "node_modules" / "oidc-provider"
SCRIPT = ROOT / "tests" / "oidc" / "provider.mjs"
PINNED = "oidc-provider@9.13.3"
CLIENT_ID = "datadesk-test"
CLIENT_SECRET = "test-client-secret-" + "x" * 24
SECRET_ENV = "DATADESK_TEST_OIDC_SECRET"


def node() -> str | None:
    return shutil.which("node") or ("/usr/bin/node" if Path("/usr/bin/node").exists() else None)


def oidc_problem() -> str | None:
    """Why the provider cannot run here (None when it can)."""
    if node() is None:
        return "Node.js is not installed (node)"
    if not (MODULE_DIR / "lib" / "index.js").exists():
        return (f"the oidc-provider package is not installed: run `npm install --prefix .oidc-provider "
                f"--no-save {PINNED}` in the repository root")
    return None


def require_oidc() -> None:
    """Skip (or fail, with DATADESK_REQUIRE_OIDC=1) when the provider cannot run."""
    problem = oidc_problem()
    if problem:
        if os.environ.get("DATADESK_REQUIRE_OIDC") == "1":
            pytest.fail(f"DATADESK_REQUIRE_OIDC=1 but {problem}", pytrace=False)
        pytest.skip(problem)


def new_key() -> dict[str, Any]:
    """A private RSA signing JWK with a fresh `kid`."""
    from joserfc.jwk import RSAKey

    kid = "k-" + secrets.token_hex(4)
    key = RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"}, private=True)
    return dict(key.as_dict(private=True))


class OIDCProvider:
    """One provider process and its files under `tmp`."""

    def __init__(self, tmp: Path, accounts: dict[str, dict[str, Any]] | None = None) -> None:
        self.dir = Path(tmp)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.accounts_file = self.dir / "accounts.json"
        self.keys_file = self.dir / "jwks.json"
        self.log_file = self.dir / "requests.log"
        self.config_file = self.dir / "config.json"
        self.keys = [new_key()]
        self.redirect_uris: list[str] = ["http://127.0.0.1:1/auth/oidc/callback"]
        self.logout_uris: list[str] = ["http://127.0.0.1:1/auth/oidc/logged-out"]
        self.claims_in_id_token = True
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.issuer = ""
        self.set_accounts(accounts or {})

    # -- files -----------------------------------------------------------------------------
    def _write(self, path: Path, doc: Any) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(path)  # the provider never reads half a file

    def _write_config(self) -> None:
        self._write(self.keys_file, {"keys": self.keys})
        self._write(self.config_file, {
            "module": str(MODULE_DIR), "port": self.port, "accounts_file": str(self.accounts_file),
            "keys_file": str(self.keys_file), "log_file": str(self.log_file),
            "cookie_keys": ["cookie-key-" + "k" * 24], "claims_in_id_token": self.claims_in_id_token,
            "clients": [{"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                         "redirect_uris": self.redirect_uris, "post_logout_redirect_uris": self.logout_uris}],
        })

    def set_accounts(self, accounts: dict[str, dict[str, Any]]) -> None:
        """`{login: {"password": ..., "claims": {...}}}`; read at every sign-in."""
        self.accounts = accounts
        self._write(self.accounts_file, accounts)

    def account(self, login: str, *, groups: list[str] | None = None, password: str = "pw",
                **claims: Any) -> None:
        """Add or replace one account: its `sub` is `login` (the provider's account id), its
        `preferred_username` defaults to `login`."""
        claims.setdefault("preferred_username", login)
        if groups is not None:
            claims["groups"] = groups
        self.set_accounts({**self.accounts, login: {"password": password, "claims": claims}})

    def set_groups(self, login: str, groups: list[str]) -> None:
        entry = json.loads(json.dumps(self.accounts[login]))
        entry["claims"]["groups"] = groups
        self.set_accounts({**self.accounts, login: entry})

    # -- the process ---------------------------------------------------------------------
    def start(self) -> "OIDCProvider":
        self._write_config()
        self.stderr = open(self.dir / "provider.err", "wb")
        self.proc = subprocess.Popen([node() or "node", str(SCRIPT), str(self.config_file)], cwd=self.dir,
                                     stdout=subprocess.PIPE, stderr=self.stderr)
        line = self.proc.stdout.readline() if self.proc.stdout else b""  # {"port", "issuer"} once it serves
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"the OpenID provider did not start: {self.errors()}")
        info = json.loads(line)
        self.port, self.issuer = info["port"], info["issuer"]
        self._write_config()  # the port is fixed now: a reload keeps it
        self.generation = 1
        return self

    def errors(self) -> str:
        return (self.dir / "provider.err").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        self.stderr.close()

    def reload(self) -> None:
        """Rewrite the config and keys, SIGHUP, and wait until the new provider serves."""
        assert self.proc is not None and self.proc.poll() is None, self.errors()
        self._write_config()
        self.proc.send_signal(signal.SIGHUP)
        want, deadline = self.generation + 1, time.time() + 15
        while httpx.get(f"{self.issuer}/__generation", timeout=5).json()["generation"] < want:
            assert time.time() < deadline, f"the provider did not reload: {self.errors()}"
            time.sleep(0.05)
        self.generation = want

    def register(self, app_base: str) -> None:
        """The test client's redirect URIs are `app_base`'s callback and logged-out pages."""
        self.redirect_uris = [f"{app_base}/auth/oidc/callback"]
        self.logout_uris = [f"{app_base}/auth/oidc/logged-out"]
        self.reload()

    def rotate_keys(self) -> str:
        """Sign with a new key from now on (the old one is withdrawn); returns its kid."""
        self.keys = [new_key()]
        self.reload()
        return self.keys[0]["kid"]

    def requests(self) -> list[str]:
        return self.log_file.read_text().splitlines() if self.log_file.exists() else []

    # -- tokens the provider would not make itself ------------------------------------------
    def sign(self, claims: dict[str, Any], key: dict[str, Any] | None = None, kid: str | None = None) -> str:
        """A JWT with `claims`, signed with the provider's current key (or `key`), `kid` in its header."""
        from joserfc import jwt
        from joserfc.jwk import RSAKey

        jwk = key or self.keys[0]
        header = {"alg": "RS256", "kid": kid or jwk["kid"], "typ": "JWT"}
        return jwt.encode(header, claims, RSAKey.import_key(jwk))

    def settings(self, **over: Any) -> dict[str, Any]:
        """`[auth.oidc]` for an app that signs in here (the secret from `SECRET_ENV`)."""
        os.environ[SECRET_ENV] = CLIENT_SECRET
        return {"issuer": self.issuer, "client_id": CLIENT_ID, "client_secret": "${env:%s}" % SECRET_ENV,
                "scopes": ["openid", "profile", "email", "groups"], **over}


@pytest.fixture(scope="module")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OIDCProvider]:
    """A running provider for a module's tests (no accounts until a test adds them)."""
    require_oidc()
    provider = OIDCProvider(tmp_path_factory.mktemp("oidc")).start()
    try:
        yield provider
    finally:
        provider.stop()


class Browser:
    """A headless user agent: one httpx client (one cookie jar) for the app and the provider,
    redirects followed by hand so a test can stop at the app's callback."""

    def __init__(self, app_base: str, provider: OIDCProvider) -> None:
        self.app = app_base
        self.provider = provider
        self.http = httpx.Client(timeout=30, follow_redirects=False)
        self.signed_in_as: str | None = None  # whose session the provider holds for this browser

    def close(self) -> None:
        self.http.close()

    def follow(self, r: httpx.Response, stop_at: str | None = None) -> httpx.Response:
        """Follow redirects from `r` until one is not a redirect or points at `stop_at` (a path prefix
        of the app); returns that response (or the redirect, with `.next_url`)."""
        for _ in range(20):
            if r.status_code not in (301, 302, 303, 307, 308):
                return r
            url = urljoin(str(r.url), r.headers["location"])
            if stop_at and url.startswith(self.app + stop_at):
                r.next_url = url  # type: ignore[attr-defined]
                return r
            r = self.http.get(url)
        raise AssertionError("too many redirects")

    def start(self, next_path: str | None = None) -> httpx.Response:
        """GET the app's /auth/oidc/login and follow to the provider's login form, or (while the
        provider's own session lasts) straight to the redirect to the app's callback."""
        params = {"next": next_path} if next_path is not None else {}
        return self.follow(self.http.get(f"{self.app}/auth/oidc/login", params=params), stop_at="/auth/oidc/callback")

    def submit_login(self, form_page: httpx.Response, login: str, password: str = "pw") -> httpx.Response:
        action = unescape(re.search(r'<form method="post" action="([^"]+)"', form_page.text).group(1))
        return self.http.post(urljoin(str(form_page.url), action), data={"login": login, "password": password})

    def callback_url(self, login: str, password: str = "pw", next_path: str | None = None) -> str:
        """Sign in at the provider as `login`; the app's callback URL it sends the browser to."""
        form = self.start(next_path)
        if hasattr(form, "next_url"):  # the provider's session signed the browser in without its form
            assert self.signed_in_as == login, f"the provider's session is {self.signed_in_as}'s, not {login}'s"
            return form.next_url  # type: ignore[attr-defined]
        assert "op-login" in form.text, f"expected the provider's login form, got {form.status_code}: {form.text[:500]}"
        done = self.follow(self.submit_login(form, login, password), stop_at="/auth/oidc/callback")
        assert hasattr(done, "next_url"), f"the provider did not send the browser back: {done.status_code} {done.text[:500]}"
        self.signed_in_as = login
        return done.next_url  # type: ignore[attr-defined]

    def sign_in(self, login: str, password: str = "pw", next_path: str | None = None) -> httpx.Response:
        """The whole sign-in; returns the app's answer to the callback (303 into the app, or a page)."""
        return self.http.get(self.callback_url(login, password, next_path))

    def csrf(self) -> str:
        return self.http.get(f"{self.app}/api/me").json()["csrf"]


def query_of(url: str) -> dict[str, str]:
    from urllib.parse import parse_qsl

    return dict(parse_qsl(urlsplit(url).query))
