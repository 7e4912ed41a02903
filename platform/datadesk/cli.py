"""`datadesk serve | users ...`: the command line."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from datadesk.settings import Settings, SettingsError, load_settings

log = logging.getLogger("datadesk")

FIRST_ADMIN = "admin"
ALL_PERMISSIONS = ["admin", "code_execution", "memory"]


def bootstrap(settings: Settings) -> tuple[bool, str | None]:
    """Create the data dir, the demo workspace and the first admin. Returns (created_admin, token)."""
    from datadesk.composition import open_users
    from datadesk.store.layout import Layout
    from datadesk.store.users import UserError
    from datadesk.store.workspaces import ensure_demo_workspace

    layout = Layout(settings.home)
    layout.home.mkdir(parents=True, exist_ok=True)
    if ensure_demo_workspace(layout, memory=True):
        log.info("created the demo workspace in %s", layout.workspace_dir("demo"))
    users, close = open_users(settings)
    try:
        if not users.list():
            try:
                _, token = users.add(FIRST_ADMIN, ["demo"], ALL_PERMISSIONS)
            except UserError:  # another host of the cluster made it a moment ago
                return False, None
            return True, token
        return False, None
    finally:
        close()


def local_sandbox_problem(settings: Settings) -> str | None:
    """The local sandbox is no security boundary: only for one trusted user on localhost."""
    if settings.sandbox.backend != "local":
        return None
    log.warning("local sandbox: user code runs as this process's user on this host; it is NOT a "
                "security boundary. Use sandbox.backend = \"docker\" for anything shared.")
    if settings.sandbox.allow_unsafe_local:
        return None
    from datadesk.composition import open_users

    host = settings.server.host
    if host not in ("127.0.0.1", "localhost", "::1"):
        return (f"the local sandbox is not a security boundary and the server would listen on {host}; "
                "use the docker sandbox (sandbox.backend = \"docker\") or pass --allow-unsafe-local-sandbox")
    users, close = open_users(settings)
    try:
        coders = [u.id for u in users.list() if "code_execution" in u.permissions and not u.revoked]
    finally:
        close()
    if len(coders) > 1:
        return (f"the local sandbox is not a security boundary and {len(coders)} users have code_execution "
                f"({', '.join(coders)}); use the docker sandbox or pass --allow-unsafe-local-sandbox")
    return None


def cmd_sandbox(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from datadesk.sandbox.backends.docker.image import build_image

    context = Path(args.context) if args.context else Path(__file__).resolve().parents[2] / "sandbox_image"
    try:
        tag = build_image(context, force=args.force, base=args.base)
    except Exception as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(tag)
    return 0


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from datadesk.api.app import create_app
    from datadesk.api.guards.auth import RedactSecrets
    from datadesk.composition import Runtime

    if args.host:
        settings.server.host = args.host
    if args.port:
        settings.server.port = args.port
    if args.allow_unsafe_local_sandbox:
        settings.sandbox.allow_unsafe_local = True
    if args.workers is not None:
        settings.server.workers = args.workers
    if settings.server.workers < 1:
        print(f"error: --workers / server.workers must be at least 1, not {settings.server.workers}",
              file=sys.stderr)
        return 2
    created, token = bootstrap(settings)
    problem = local_sandbox_problem(settings)
    if problem:
        print(f"refusing to start: {problem}", file=sys.stderr)
        return 2
    from datadesk.llm.tokens import count_tokens

    count_tokens("warm up")  # load the tokenizer now, not in the first user's turn
    rt = Runtime(settings)
    from datadesk.store.workspaces import WorkspaceConfigError

    try:
        rt.validate_workspaces()  # a bad workspace.toml fails now, naming the file and the key
    except WorkspaceConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    admin = next((u for u in rt.users.list() if "admin" in u.permissions and not u.revoked), None)
    host, port = settings.server.host, settings.server.port
    base = settings.server.public_url or f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    print(f"DataDesk {rt.model_info()['name']} | data: {rt.layout.home}", flush=True)
    if rt.model.is_demo:
        print("  demo model, no LLM configured: set DATADESK_LLM_BASE_URL / DATADESK_LLM_API_KEY / "
              "DATADESK_LLM_MODEL to use a real one", flush=True)
    if not settings.auth.code_login:  # login links are refused: single sign-on is the way in
        print(f"  sign in with single sign-on: {base}/auth/oidc/login", flush=True)
    elif admin is not None and not rt.users.has_logged_in(admin.id):  # else the log would hand out admin
        code = rt.users.new_login_code(admin.id, settings.auth.login_code_ttl_s)
        print(f"  open this one-time login URL (valid {settings.auth.login_code_ttl_s // 60} min):"
              f"\n\n    {base}/login?code={code}\n", flush=True)
    elif admin is not None:
        print("  for a one-time login URL run: datadesk users login-url NAME", flush=True)
    if created and token:
        print(f"  API token of user '{FIRST_ADMIN}' (shown once): {token}\n", flush=True)
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn"):
        logging.getLogger(name).addFilter(RedactSecrets())
    if settings.server.workers > 1:
        return _serve_workers(settings)
    from datadesk.api.logs import uvicorn_log_config

    sys.setswitchinterval(settings.server.gil_switch_interval_ms / 1000)
    config = uvicorn.Config(create_app(rt), host=host, port=port, proxy_headers=False, log_level="info",
                            log_config=uvicorn_log_config(settings.server.log_format))
    uvicorn.Server(config).run()
    return 0


WORKER_SETTINGS_ENV = "DATADESK_WORKER_SETTINGS"
_SECRET_FIELD = ("api_key", "token", "secret", "password", "secret_key", "database_url")  # database_url: it holds a password


def _secret_paths(struct: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Dotted paths of the settings fields that hold secrets (by name)."""
    import msgspec

    out: list[tuple[str, ...]] = []
    for f in msgspec.structs.fields(type(struct)):
        value = getattr(struct, f.name)
        if isinstance(value, msgspec.Struct):
            out += _secret_paths(value, (*prefix, f.name))
        elif any(f.name.endswith(word) for word in _SECRET_FIELD):
            out.append((*prefix, f.name))
    return out


def _serve_workers(settings: Settings) -> int:
    """Several app processes on one socket (uvicorn's supervisor). Bootstrap, validation and the
    login URL happened once, here; each worker builds its own Runtime from a snapshot of these
    settings (a 0600 file named by an environment variable; secrets are left out of it and each
    worker reads them again from the environment / config file, never from argv)."""
    import os
    import shutil

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from datadesk.api.logs import uvicorn_log_config
    from datadesk.api.metrics import multiprocess_dir

    file = write_worker_settings(settings)
    os.environ[WORKER_SETTINGS_ENV] = str(file)  # inherited by the spawned workers
    # /metrics of any worker answers for all (prometheus_client's multiprocess mode, api/metrics.py)
    metrics_dir = multiprocess_dir(settings.home)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    print(f"  {settings.server.workers} workers share this data directory (file locks)", flush=True)
    try:
        config = uvicorn.Config("datadesk.cli:worker_app", factory=True, host=settings.server.host,
                                port=settings.server.port, workers=settings.server.workers,
                                proxy_headers=False, log_level="info",
                                log_config=uvicorn_log_config(settings.server.log_format))
        Multiprocess(config, sockets=[config.bind_socket()]).run()
    finally:
        file.unlink(missing_ok=True)
        shutil.rmtree(metrics_dir, ignore_errors=True)  # the workers' value files end with them
    return 0


def write_worker_settings(settings: Settings):
    """The settings snapshot for the workers: `<home>/run/serve-<pid>.json`, mode 600, without the
    secret fields (each worker reads those again). Returns its absolute path."""
    import os

    import msgspec

    from datadesk.store.files import write_atomic

    snapshot = msgspec.to_builtins(settings, enc_hook=str)
    snapshot["home"] = str(settings.home.resolve())
    for path in _secret_paths(settings):
        node = snapshot
        for part in path[:-1]:
            node = node[part]
        node.pop(path[-1], None)  # the default until the worker reads it again
    run = settings.home / "run"
    run.mkdir(parents=True, exist_ok=True)
    file = (run / f"serve-{os.getpid()}.json").resolve()
    write_atomic(file, msgspec.json.encode(snapshot), mode=0o600)
    return file


def worker_settings(env=None) -> Settings:
    """In a worker process: the parent's settings snapshot, with the secrets read again from the
    environment / config file (`env`: default os.environ)."""
    import os
    from pathlib import Path

    import msgspec

    env = os.environ if env is None else env
    path = env.get(WORKER_SETTINGS_ENV)
    if not path:
        raise SettingsError(f"{WORKER_SETTINGS_ENV} is not set: start workers with `datadesk serve --workers N`")
    try:
        settings = msgspec.json.decode(Path(path).read_bytes(), type=Settings, dec_hook=lambda t, o: Path(o))
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SettingsError(f"{WORKER_SETTINGS_ENV}={path}: unreadable settings snapshot: {exc}") from None
    fresh = load_settings(env)
    for secret in _secret_paths(settings):
        target, source = settings, fresh
        for part in secret[:-1]:
            target, source = getattr(target, part), getattr(source, part)
        setattr(target, secret[-1], getattr(source, secret[-1]))
    return settings


def worker_app():
    """The app factory each worker of `serve --workers N` imports (uvicorn `factory=True`)."""
    from datadesk.api.app import create_app
    from datadesk.api.guards.auth import RedactSecrets
    from datadesk.api.logs import configure_logging
    from datadesk.composition import Runtime
    from datadesk.llm.tokens import count_tokens

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    RedactSecrets.install()  # every line of the root's handlers: no credential in the app's own logs
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn"):
        logging.getLogger(name).addFilter(RedactSecrets())
    settings = worker_settings()
    configure_logging(settings.server.log_format)  # text or JSON lines, the secret filter on the handler
    count_tokens("warm up")
    sys.setswitchinterval(settings.server.gil_switch_interval_ms / 1000)
    return create_app(Runtime(settings))


def cmd_users(args: argparse.Namespace, settings: Settings) -> int:
    from datadesk.composition import open_users
    from datadesk.store.users import UserError

    users, close = open_users(settings)
    try:
        if args.users_cmd == "add":
            perms = []
            if args.can_execute_code:
                perms.append("code_execution")
            if args.admin:
                perms.append("admin")
            if args.memory:
                perms.append("memory")
            user, token = users.add(args.name, args.workspace, perms)
            print(f"created user {user.id} (workspaces: {', '.join(user.workspaces)}; "
                  f"permissions: {', '.join(user.permissions) or 'none'})")
            print(f"API token (shown once, store it now): {token}")
        elif args.users_cmd == "list":
            for u in users.list():
                state = "revoked" if u.revoked else "active"
                print(f"{u.id}\t{state}\t{','.join(u.workspaces)}\t{','.join(u.permissions) or '-'}")
        elif args.users_cmd == "revoke":
            users.revoke(args.name)
            print(f"revoked user {args.name}: all tokens and sessions stopped working")
        elif args.users_cmd == "login-url":
            code = users.new_login_code(args.name, settings.auth.login_code_ttl_s)
            base = settings.server.public_url or f"http://{settings.server.host}:{settings.server.port}"
            print(f"{base}/login?code={code}")
        elif args.users_cmd == "delete":
            if not args.yes:
                print(f"this deletes user {args.name} and ALL their threads, artifacts and memory; "
                      "repeat with --yes", file=sys.stderr)
                return 2
            removed = users.delete(args.name)
            removed_containers = _remove_user_containers(settings, args.name)
            print(f"deleted user {args.name}: {len(removed)} workspace folder(s), "
                  f"{removed_containers} sandbox kernel(s)")
        elif args.users_cmd == "token":
            print(users.new_token(args.name))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        close()
    return 0


def _remove_user_containers(settings: Settings, uid: str) -> int:
    """The user's kernel slots go too (their /data holds hard links to the user's files), and
    with the docker backend their containers; a running server's local kernels are reaped."""
    from datadesk.sandbox.sessions import purge_user_slots

    kernels = purge_user_slots(settings.home, uid)
    if settings.sandbox.backend != "docker" or not kernels:
        return len(kernels)
    try:
        from datadesk.sandbox.backends.docker.container import DockerSandbox

        sandbox = DockerSandbox(settings.sandbox, settings.home)
        for kid in kernels:
            for c in sandbox.client.containers.list(all=True, filters={"label": [
                    f"datadesk.home={sandbox.home_label}", f"datadesk.kernel={kid}"]}):
                c.remove(force=True)
    except Exception as exc:
        log.warning("could not remove the user's sandbox containers: %s", exc)
    return len(kernels)


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """`datadesk migrate`: copy this file home into PostgreSQL and an object store, offline (or,
    with --verify, compare the two and exit 1 on a difference)."""
    import tempfile
    import time
    from pathlib import Path

    url = args.database_url or settings.cluster.database_url
    storage = args.storage_url or settings.storage.url
    endpoint = args.storage_endpoint or settings.storage.endpoint
    if not url or not storage:
        print("error: datadesk migrate needs --database-url (or DATADESK_CLUSTER_DATABASE_URL) and --storage-url "
              "s3://bucket/prefix (or DATADESK_STORAGE_URL)", file=sys.stderr)
        return 2
    try:
        from datadesk.cluster.objects.blobs import S3Blobs
        from datadesk.cluster.database import Database, DatabaseError
        from datadesk.cluster.migration.copy import HomeInUse, migrate_home
        from datadesk.store.interfaces.blobs import BlobError
    except ImportError as exc:
        print(f"error: the cluster packages are not installed ({exc.name}): pip install -e '.[cluster]'",
              file=sys.stderr)
        return 2
    shown = [0.0]

    def progress(stage: str, done: int, total: int) -> None:
        if done == total or time.monotonic() - shown[0] >= 1.0:
            shown[0] = time.monotonic()
            print(f"{stage}: {done}/{total}", flush=True)

    db = None
    try:
        db = Database(url, max_size=4, name="datadesk-migrate")
        if not args.verify:
            db.migrate()
        with tempfile.TemporaryDirectory(prefix="datadesk-migrate-") as cache:  # no cache: every object once
            blobs = S3Blobs(storage, endpoint, Path(cache), 0)
            print(f"{'verifying' if args.verify else 'migrating'} {settings.home} -> {db.where}, {blobs.where}",
                  flush=True)
            report = migrate_home(settings, db, blobs, verify=args.verify, progress=progress)
    except (HomeInUse, DatabaseError, BlobError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if db is not None:
            db.close()
    print(report.summary(), flush=True)
    return 1 if args.verify and not report.ok else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="datadesk", description="Self-hosted data-analysis chat.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the web app (creates ./var and a demo workspace on first start)")
    s.add_argument("--host", help="listen address (default 127.0.0.1)")
    s.add_argument("--port", type=int, help="listen port (default 8000)")
    s.add_argument("--workers", type=int, help="app processes sharing the data directory (default 1; "
                                                "setting server.workers)")
    s.add_argument("--allow-unsafe-local-sandbox", action="store_true",
                   help="run the local (unisolated) sandbox even beyond localhost or with several coders")
    sb = sub.add_parser("sandbox", help="sandbox image")
    sbs = sb.add_subparsers(dest="sandbox_cmd", required=True)
    b = sbs.add_parser("build", help="build the kernel image offline (wheels + debootstrap base if needed)")
    b.add_argument("--force", action="store_true", help="rebuild even if the tagged image exists")
    b.add_argument("--base", help="base image (default python:3.11-slim, else a debootstrap bookworm base)")
    b.add_argument("--context", help="build context (default: sandbox_image/ of the source tree)")
    u = sub.add_parser("users", help="manage users and tokens")
    us = u.add_subparsers(dest="users_cmd", required=True)
    a = us.add_parser("add", help="add a user and print its API token once")
    a.add_argument("name")
    a.add_argument("--workspace", action="append", required=True, help="workspace (repeat for several)")
    a.add_argument("--can-execute-code", action="store_true", help="grant the code_execution permission")
    a.add_argument("--admin", action="store_true", help="grant the admin permission")
    a.add_argument("--memory", action="store_true", help="grant the memory permission")
    us.add_parser("list", help="list users")
    r = us.add_parser("revoke", help="revoke a user's tokens and sessions")
    r.add_argument("name")
    lu = us.add_parser("login-url", help="print a one-time login URL for a user")
    lu.add_argument("name")
    d = us.add_parser("delete", help="delete a user and everything of theirs (threads, artifacts, memory)")
    d.add_argument("name")
    d.add_argument("--yes", action="store_true", help="confirm")
    t = us.add_parser("token", help="issue an additional API token for a user")
    t.add_argument("name")
    m = sub.add_parser("migrate", help="copy this file home into PostgreSQL and an object store (stop the "
                                        "servers first), or --verify the copy")
    m.add_argument("--database-url", help="postgresql://user:password@host/db (default: cluster.database_url; "
                                          "DATADESK_CLUSTER_DATABASE_URL keeps the password off the command line)")
    m.add_argument("--storage-url", help="s3://bucket/prefix (default: storage.url)")
    m.add_argument("--storage-endpoint", help="an S3-compatible server's URL (default: storage.endpoint; unset: AWS)")
    m.add_argument("--verify", action="store_true",
                   help="write nothing: compare counts, seqs and hashes per thread; exit 1 on a difference")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from datadesk.api.guards.auth import RedactSecrets

    RedactSecrets.install()  # every line of the root's handlers: no credential in the app's own logs
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    from datadesk.api.logs import configure_logging
    from datadesk.store.interfaces.errors import ClusterUnavailable

    configure_logging(settings.server.log_format)  # text or JSON lines, the secret filter on the handler

    try:
        if args.cmd == "serve":
            return cmd_serve(args, settings)
        if args.cmd == "sandbox":
            return cmd_sandbox(args, settings)
        if args.cmd == "migrate":
            return cmd_migrate(args, settings)
        return cmd_users(args, settings)
    except SettingsError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    except ClusterUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
