"""One `Settings` object, read once (environment + optional TOML), passed down.

Precedence: explicit constructor values (tests) > environment > TOML file >
defaults. The TOML file is `$DATADESK_CONFIG`, else `$DATADESK_HOME/datadesk.toml`
if it exists. Its tables mirror the sub-settings: `[llm]`, `[chat]`, `[context]`,
`[sql]`, `[limits]`, `[offload]`, `[sandbox]`, `[server]`, `[auth]`. Every field has its own heading in docs/reference.md (a test checks).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import msgspec


class ModelPrice(msgspec.Struct, forbid_unknown_fields=True):
    """What one model costs per million tokens (`[llm.prices."<model>"]`; chat/costs.py)."""

    input_per_mtok: Annotated[float, msgspec.Meta(ge=0)]
    output_per_mtok: Annotated[float, msgspec.Meta(ge=0)]
    cached_input_per_mtok: Annotated[float, msgspec.Meta(ge=0)] | None = None  # unset: the input price
    currency: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}$")] = "USD"


class LLMSettings(msgspec.Struct, forbid_unknown_fields=True):
    base_url: str | None = None
    api_key: str | None = None
    model: str = "gpt-4o-mini"
    timeout_s: float = 120.0
    max_retries: int = 3
    retry_backoff_s: float = 0.5
    temperature: float | None = None
    provider: str = "auto"  # what the server supports for JSON answers (context.profiles.PROVIDERS)
    prices: dict[str, ModelPrice] = msgspec.field(default_factory=dict)  # per model name: the cost of a turn
    http_client: Literal["auto", "aiohttp", "httpx"] = "auto"  # under the SDK (llm.client.http_client)


class ChatSettings(msgspec.Struct, forbid_unknown_fields=True):
    max_steps: int = 12
    max_turns_per_user: int = 2
    finish_in_background: bool = True  # a turn outlives its client; false: the client that starts it cancels it by leaving
    tool_timeout_s: float = 120.0


class ModelProfileSettings(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Overrides of a model profile; unset fields keep the family default."""

    window_tokens: int | None = None
    reserved_output_tokens: int | None = None
    vision: bool | None = None
    preamble: str | None = None  # "system" (second system message) | "user" (labelled user preamble)
    replay_reasoning: bool | None = None
    token_factor: float | None = None
    structured_output: str | None = None  # "json_schema" | "json_object" | "none"


class ContextSettings(msgspec.Struct, forbid_unknown_fields=True):
    history_budget_tokens: int = 32_000
    trim_chunk_fraction: float = 0.2
    append_only: bool = True  # keep the window's bytes between trims (prefix caches); False: compact by age
    trim_target_fraction: float = 0.5  # a forced trim leaves at most this share of the budget
    recent_turns: int = 2
    recent_result_chars: int = 8_000
    stub_head_chars: int = 400
    read_tool_turns: int = 6
    read_tools: list[str] = msgspec.field(default_factory=lambda: ["read_tool_result", "load_skill"])
    max_images: int = 4
    image_tokens: int = 1_000
    tools_max_fraction: float = 0.15
    warn_level: float = 0.70
    compact_level: float = 0.85
    refuse_level: float = 1.0
    max_message_tokens: int = 8_000
    calibration_margin: float = 0.05
    profiles: dict[str, ModelProfileSettings] = msgspec.field(default_factory=dict)


class SummarySettings(msgspec.Struct, forbid_unknown_fields=True):
    enabled: bool = True
    refresh_after_records: int = 4
    max_tokens: int = 1_500
    uncovered_allowance: float = 0.25
    revisions_kept: int = 10
    timeout_s: float = 120.0
    max_attempts: int = 2  # summarizer calls for an invalid answer: the first, then retries showing its error
    # back-off (summary/service.py): failed refreshes in a row before summaries pause (0: never pause),
    # and the longest pause, in records
    backoff_after: Annotated[int, msgspec.Meta(ge=0)] = 2
    backoff_max_records: Annotated[int, msgspec.Meta(ge=1)] = 256


class MemorySettings(msgspec.Struct, forbid_unknown_fields=True):
    max_active: int = 50
    max_chars: int = 500
    max_total_chars: int = 8_000
    max_inactive: int = 200
    extraction_max_candidates: int = 5


class SQLSettings(msgspec.Struct, forbid_unknown_fields=True):
    timeout_s: float = 30.0


class LimitsSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Bounds on what one user's work may take from the server (issue 15), in one place."""

    sql_memory_mb: int = 512  # DuckDB memory_limit of a warehouse instance (its queries together)
    sql_threads: int = 2  # DuckDB threads of a warehouse instance
    sql_temp_mb: int = 1024  # max_temp_directory_size (spill files, under <home>/tmp/sql)
    max_threads_per_user: int = 1_000  # threads one user may hold per workspace
    sql_queries_per_user: int = 1  # queries one user may run at once (a slot covers the database work only)
    sql_queries: int = 2  # queries running at once in one app process, all users together
    # how long a query waits in line for a slot before it is refused: 60 users x ~0.15 s of database
    # work over 2 slots drain in ~5 s, so 60 s is 10x that and still half of chat.tool_timeout_s
    sql_queue_s: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    # large results written to artifacts at once in one app process (0: one per CPU core), and of one user;
    # more wait in line and are never refused
    offload_writers: Annotated[int, msgspec.Meta(ge=0)] = 0
    offload_writers_per_user: Annotated[int, msgspec.Meta(ge=1)] = 2
    uploads_per_user: int = 1  # uploads one user may have converting at once
    uploads: int = 2  # uploads converting at once in one app process (an .xlsx is a bounded child process each)
    uploads_queue_s: float = 30.0  # how long an upload waits for a free slot before it is refused
    app_memory_mb: int = 2_048  # the app process's memory ceiling: near it no new query starts, past it they stop
    # one answer from an MCP server (a tool result; past 8 MB a stdio server's is spooled to disk, over HTTP
    # at most 32 MB are held); past it the call is refused. 256 fits 1,000,000 rows x 10 columns as JSON
    mcp_result_max_mb: int = 256


class OffloadSettings(msgspec.Struct, forbid_unknown_fields=True):
    threshold_chars: int = 8_000
    preview_rows: int = 10
    preview_cell_chars: int = 200
    max_columns: int = 50
    max_tokens: int = 2_000
    result_max_bytes: int = 2 * 1024**3
    stream_timeout_s: float = 600.0
    upload_max_bytes: int = 200 * 1024**2
    # per-upload limits, checked while the file streams (offload.readers.limits.UploadLimits)
    upload_max_unpacked_bytes: int = 512 * 1024**2  # an .xlsx's inflated size, before inflating
    upload_max_zip_ratio: float = 200.0
    upload_max_rows: int = 10_000_000
    upload_max_columns: int = 4_096
    upload_max_cell_bytes: int = 1024**2
    upload_max_text_bytes: int = 128 * 1024**2  # a text read whole (Markdown, HTML, a repr, a JSON envelope)
    upload_max_seconds: float = 300.0
    upload_max_memory_bytes: int = 1024**3  # an .xlsx is parsed in a child process of this address space
    ttl_s: float = 7 * 24 * 3600
    thread_max_count: int = 200
    thread_max_bytes: int = 5 * 1024**3
    user_max_count: int = 1_000
    user_max_bytes: int = 10 * 1024**3
    global_max_count: int = 100_000
    global_max_bytes: int = 100 * 1024**3
    deliverable_user_max_bytes: int = 2 * 1024**3
    sweep_interval_s: float = 60.0
    auto_requery: bool = False


class SandboxSettings(msgspec.Struct, forbid_unknown_fields=True):
    backend: str = "local"  # local | docker | gateway | none
    image: str = "datadesk-sandbox:latest"
    pool_size: int = 1
    max_kernels_per_user: int = 3
    max_kernels: int = 20
    idle_timeout_s: float = 900.0
    max_lifetime_s: float = 14_400.0
    reap_interval_s: float = 30.0
    exec_timeout_s: float = 120.0
    start_timeout_s: float = 60.0
    memory_mb: int = 2048
    cpus: float = 1.0
    pids_limit: int = 256
    tmp_mb: int = 256
    outputs_mb: int = 100
    output_head_chars: int = 6_000
    output_tail_chars: int = 2_000
    run_dir: str = ""  # short directory for kernel sockets; default <home>/run
    shared_dir: str = ""  # app in a container: the dir the engine sees at the same path (docker backend)
    allow_unsafe_local: bool = False
    heartbeat_s: float = 5.0  # how often a worker touches its heartbeat file (kernel ownership)
    owner_stale_s: float = 60.0  # a worker whose heartbeat is older is gone: its kernels are orphans
    # docker backend: each kernel runs as its own uid = gid from this range, used by no host account
    docker_uid_base: int = 1_900_000_000
    docker_uid_count: int = 65_536
    # backend "gateway": kernels on a Jupyter Kernel Gateway / Enterprise Gateway (sandbox/backends/gateway/)
    gateway_url: str = ""
    gateway_token: str = ""  # also DATADESK_GATEWAY_TOKEN; sent as `Authorization: token ...` only
    gateway_kernel_name: str = "python3"
    gateway_shared_dir: str = ""  # app side of the volume kernels share; default <home>
    gateway_kernel_shared_dir: str = ""  # where kernels see that volume; default: the same path
    gateway_kernel_env: dict[str, str] = msgspec.field(default_factory=dict)  # extra KERNEL_* variables
    # how kernels get /data and give back /outputs: "volume" (the shared dir above), "presigned"
    # (presigned URLs of the object store, no shared volume), "auto": presigned in a cluster
    # (cluster.database_url set) unless gateway_shared_dir is set, else volume
    gateway_files: str = "auto"
    gateway_kernel_files_dir: str = ""  # presigned: kernel-side root of each kernel's data/ and outputs/; default /data, /outputs


class ServerSettings(msgspec.Struct, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1  # app processes (`datadesk serve --workers N`); they share state through file locks
    max_body_bytes: int = 1_048_576
    public_url: str | None = None
    trusted_proxies: list[str] = msgspec.field(default_factory=list)  # IPs/CIDRs whose X-Forwarded-For counts
    # per-user request limits (api/guards/ratelimit.py), per worker; unauthenticated: per client
    # address; 0: off
    requests_per_minute_per_user: int = 600  # sustained rate of a user's token bucket
    request_burst_per_user: int = 200  # the bucket's size: what a page load or a quick burst may spend at once
    requests_in_flight_per_user: int = 32  # a user's requests being answered at once (event streams apart)
    streams_per_user: int = 10  # a user's open event streams (a turn's POST stream, re-attached GET /events)
    requests_in_flight: int = 256  # requests being answered at once by one worker, all users (503 past it)
    # one secret for CSRF tokens and anything signed, the same on every host (DATADESK_SECRET_KEY);
    # unset: a key made once per home (`csrf.key`), which only one host can share
    secret_key: str | None = None
    # the bearer token a Prometheus scraper sends to `/metrics` (DATADESK_METRICS_TOKEN); unset: no /metrics (404)
    metrics_token: str | None = None
    log_format: Literal["text", "json"] = "text"  # "json": one JSON object a line, with the turn and thread ids
    # how long a thread may hold the interpreter before another one that waits for it gets it
    # (sys.setswitchinterval; Python's own is 5): the event loop waits about this long to run again
    # after each blocking call while a worker thread is busy in Python
    gil_switch_interval_ms: Annotated[float, msgspec.Meta(gt=0, le=100)] = 1.0


class ClusterSettings(msgspec.Struct, forbid_unknown_fields=True):
    # PostgreSQL that holds the truth for several hosts (SCALE.md); unset: the embedded file set
    database_url: str | None = None  # postgresql://user:password@host/db (DATADESK_CLUSTER_DATABASE_URL)
    pool_size: int = 8  # connections per app process
    host_id: str | None = None  # this host's name in the cluster (default: the machine's host name)


class StorageSettings(msgspec.Struct, forbid_unknown_fields=True):
    # the object store for every file a user has, with the cluster set: s3://bucket/prefix
    url: str | None = None  # DATADESK_STORAGE_URL
    endpoint: str | None = None  # any S3-compatible server (DATADESK_STORAGE_ENDPOINT); unset: AWS
    cache_mb: int = 2048  # this host's read-through cache of objects (keys are written once: never stale)
    presign_ttl_s: int = 300  # how long a presigned URL handed to a kernel works
    # credentials come only from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_REGION


class StoreSettings(msgspec.Struct, forbid_unknown_fields=True):
    # when a thread's log reaches the disk itself: "record" (each append), "turn" (end of each turn),
    # "never" (the kernel's write-back); a process crash loses nothing written in any mode
    fsync: Literal["record", "turn", "never"] = "turn"
    min_free_mb: int = 100  # below this much free space in the home, new turns and uploads are refused


class OIDCGroupGrant(msgspec.Struct, forbid_unknown_fields=True):
    """What membership of one provider group grants (`[auth.oidc.groups."<group>"]`)."""

    workspaces: list[str] = msgspec.field(default_factory=list)
    can_execute_code: bool = False
    memory: bool = False
    admin: bool = False


class OIDCSettings(msgspec.Struct, forbid_unknown_fields=True):
    """OpenID Connect single sign-on (`[auth.oidc]`); off while `issuer` is empty."""

    issuer: str = ""  # e.g. https://login.example.com/realms/acme (discovery: <issuer>/.well-known/openid-configuration)
    client_id: str = ""
    client_secret: str = ""  # "${env:VAR}" reads it from the environment (never written in the file)
    scopes: list[str] = msgspec.field(default_factory=lambda: ["openid", "profile", "email"])
    username_claim: str = "preferred_username"  # the claim that names the DataDesk user
    groups_claim: str = "groups"
    button_label: str = "Sign in with single sign-on"
    public_url: str = ""  # this app's external base URL (the redirect URI's); default: from the request
    groups: dict[str, OIDCGroupGrant] = msgspec.field(default_factory=dict)


class AuthSettings(msgspec.Struct, forbid_unknown_fields=True):
    login_attempts_per_minute: int = 10  # failed attempts per client address and minute
    login_attempts_per_account: int = 20  # failed attempts per account and minute (from any address)
    session_ttl_s: int = 7 * 24 * 3600  # how long a session of a login link or token lasts
    session_max_age_s: int = 12 * 3600  # a single-sign-on session: after this, sign in again (grants re-read)
    login_code_ttl_s: int = 600  # a login link works for minutes
    code_login: bool = True  # sign-in with login links and tokens in the browser (false: single sign-on only)
    invitation_ttl_s: int = 7 * 24 * 3600  # an invitation link works this long, once
    cookie_secure: bool = False
    oidc: OIDCSettings = msgspec.field(default_factory=OIDCSettings)


class AuditSettings(msgspec.Struct, forbid_unknown_fields=True):
    """The audit trail (`[audit]`): who queried which source, downloads, sign-ins, admin changes."""

    retention_days: int = 400  # entries older than this are removed (0: kept forever)


class RefreshSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Scheduled refreshes of threads (`[refresh]`, threads/scheduler.py)."""

    schedules: bool = True  # the scheduler loop runs in the server (false: schedules are kept, not run)
    schedule_tick_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0  # how often due schedules are looked for
    # how often every thread is looked at for schedules set elsewhere (another host, a restore)
    schedule_rescan_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    scheduled_max: Annotated[int, msgspec.Meta(ge=1)] = 2  # at once in one server process (one per user)


class Settings(msgspec.Struct, forbid_unknown_fields=True):
    home: Path = Path("var")
    llm: LLMSettings = msgspec.field(default_factory=LLMSettings)
    chat: ChatSettings = msgspec.field(default_factory=ChatSettings)
    sql: SQLSettings = msgspec.field(default_factory=SQLSettings)
    limits: LimitsSettings = msgspec.field(default_factory=LimitsSettings)
    offload: OffloadSettings = msgspec.field(default_factory=OffloadSettings)
    context: ContextSettings = msgspec.field(default_factory=ContextSettings)
    summary: SummarySettings = msgspec.field(default_factory=SummarySettings)
    memory: MemorySettings = msgspec.field(default_factory=MemorySettings)
    sandbox: SandboxSettings = msgspec.field(default_factory=SandboxSettings)
    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    store: StoreSettings = msgspec.field(default_factory=StoreSettings)
    cluster: ClusterSettings = msgspec.field(default_factory=ClusterSettings)
    storage: StorageSettings = msgspec.field(default_factory=StorageSettings)
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    audit: AuditSettings = msgspec.field(default_factory=AuditSettings)
    refresh: RefreshSettings = msgspec.field(default_factory=RefreshSettings)

    @property
    def clustered(self) -> bool:
        """The cluster set (PostgreSQL + object store) rather than the embedded files."""
        return bool(self.cluster.database_url)

    @property
    def llm_configured(self) -> bool:
        return bool(self.llm.base_url or self.llm.api_key)


class SettingsError(ValueError):
    """A bad setting: names the source (file or variable), the key and what is wrong."""


# Environment variables that map to one setting each (documented in docs/reference.md).
ENV_VARS: dict[str, tuple[str, str]] = {
    "DATADESK_LLM_BASE_URL": ("llm", "base_url"),
    "DATADESK_LLM_API_KEY": ("llm", "api_key"),
    "DATADESK_LLM_MODEL": ("llm", "model"),
    "DATADESK_HOST": ("server", "host"),
    "DATADESK_PORT": ("server", "port"),
    "DATADESK_PUBLIC_URL": ("server", "public_url"),
    "DATADESK_SANDBOX_BACKEND": ("sandbox", "backend"),
    "DATADESK_SANDBOX_SHARED_DIR": ("sandbox", "shared_dir"),
    "DATADESK_GATEWAY_TOKEN": ("sandbox", "gateway_token"),
    "DATADESK_CLUSTER_DATABASE_URL": ("cluster", "database_url"),
    "DATADESK_STORAGE_URL": ("storage", "url"),
    "DATADESK_STORAGE_ENDPOINT": ("storage", "endpoint"),
    "DATADESK_SECRET_KEY": ("server", "secret_key"),
    "DATADESK_METRICS_TOKEN": ("server", "metrics_token"),
    "DATADESK_LOG_FORMAT": ("server", "log_format"),
}
# Standard OpenAI variables, used only when the DATADESK_ one is unset.
FALLBACK_ENV_VARS: dict[str, tuple[str, str]] = {
    "OPENAI_BASE_URL": ("llm", "base_url"),
    "OPENAI_API_KEY": ("llm", "api_key"),
    "OPENAI_MODEL": ("llm", "model"),
}


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _dec_hook(typ: type, obj: Any) -> Any:
    if typ is Path:
        return Path(obj)
    raise NotImplementedError(typ)


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the Settings once from `env` (default: os.environ), the TOML file and overrides."""
    env = os.environ if env is None else env
    home = Path(overrides.get("home") or env.get("DATADESK_HOME") or "var")
    config_path = env.get("DATADESK_CONFIG")
    path = Path(config_path) if config_path else home / "datadesk.toml"
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"{path}: invalid TOML: {exc}") from exc
    elif config_path:
        raise SettingsError(f"DATADESK_CONFIG={config_path}: file not found")

    from_env: dict[str, Any] = {}
    for table in (FALLBACK_ENV_VARS, ENV_VARS):  # DATADESK_ wins: applied last
        for var, (section, key) in table.items():
            if env.get(var):
                from_env.setdefault(section, {})[key] = env[var]
    data = _merge(data, from_env)
    data = _merge(data, {k: v for k, v in overrides.items() if k != "home"})
    data["home"] = str(home)
    try:
        return msgspec.convert(data, Settings, strict=False, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"{path if path.is_file() else 'environment'}: {exc}") from exc


def iter_setting_names(struct: type[msgspec.Struct] = Settings, prefix: str = "") -> list[str]:
    """Dotted names of every setting (`llm.model`, `chat.max_steps`, ...)."""
    names: list[str] = []
    for f in msgspec.structs.fields(struct):
        sub = f.type if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct) else None
        if sub is not None:
            names += iter_setting_names(sub, f"{prefix}{f.name}.")
        else:
            names.append(f"{prefix}{f.name}")
    return names
