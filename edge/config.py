"""One typed settings object, read by the CLI, the server and the service alike.

Precedence, lowest first: field defaults < device profile < TOML file
(`configs/edge.toml` of a checkout, or `--config FILE`, or `EDGE_CONFIG`) <
`EDGE_*` environment variables < CLI flags (passed as init kwargs).
"""

from __future__ import annotations

import importlib.resources
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from edge.contracts.device import DeviceProfile
from edge.contracts.options import (
    DEFAULT_DRAFT_MAX,
    DEFAULT_FLASH_ATTN,
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_N_BATCH,
    DEFAULT_PROMPT_CACHE_MIB,
    DEFAULT_REASONING_BUDGET,
    DEFAULT_REASONING_FORMAT,
    DEFAULT_SLOTS,
    DEFAULT_SPECULATIVE,
    DRAFT_MAX_LIMIT,
    FlashAttn,
    ReasoningFormat,
    SpeculativeMode,
)
from edge.errors import ConfigError, InvalidRequest
from edge.kvcache import KVType
from edge.units import parse_bytes, parse_keep_alive

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parent.parent
# configs/ (default settings, device profiles, throughput tables) ships as package data:
# edge/data/configs links to the checkout's configs/ and is copied into a wheel, so a
# checkout and an installed wheel read the same files through importlib.resources.
CONFIGS_DIR = Path(str(importlib.resources.files("edge").joinpath("data", "configs")))
PROFILES_DIR = CONFIGS_DIR / "devices"


def _default_models_dir() -> Path:
    """`models/` of a source checkout, else the per-user data directory."""
    if (REPO_ROOT / "models" / "catalog.toml").exists() and os.access(REPO_ROOT / "models", os.W_OK):
        return REPO_ROOT / "models"
    import platformdirs

    return Path(platformdirs.user_data_dir("edge", appauthor=False)) / "models"


class Settings(BaseSettings):
    """Every knob of edge, each with a description and bounds."""

    model_config = SettingsConfigDict(env_prefix="EDGE_", extra="forbid", validate_default=True, frozen=False)

    # --- model store ---
    models_dir: Path = Field(
        default_factory=_default_models_dir,
        description="Where pulled models live (env EDGE_MODELS_DIR).",
    )
    default_model: str = Field(
        "smollm2-135m-instruct", min_length=1, description="Catalog model served when none is named."
    )

    # --- device ---
    profile: str | None = Field(
        None, description="Device profile in configs/devices (None: detect from the machine)."
    )
    memory_reserve_bytes: int | None = Field(
        None, ge=0, description="Memory kept free for the OS and other programs (None: from the profile)."
    )

    # --- model loading ---
    n_ctx: int | None = Field(
        None, ge=16, le=1 << 20, description="Context length in tokens (None: the planner picks)."
    )
    kv_type: KVType = Field("f16", description="KV cache element type.")
    embedding_model: str | None = Field(
        None, description="A second model (store name or .gguf path) for /v1/embeddings (None: the served "
        "model's own weights, mean-pooled unless its GGUF names a pooling)."
    )
    gpu_layers: int | Literal["auto"] = Field(
        "auto", description="Layers offloaded to the GPU; 'auto' lets the planner decide."
    )
    n_batch: int = Field(
        DEFAULT_N_BATCH, ge=16, le=8192, description="Maximum tokens per llama_decode batch."
    )
    threads: int | None = Field(
        None, ge=1, le=256, description="Decode threads (None: from the profile or CPU count)."
    )
    slots: int = Field(DEFAULT_SLOTS, ge=1, le=64, description="Sequences that may share one batch.")
    speculative: SpeculativeMode = Field(
        DEFAULT_SPECULATIVE, description="Speculative decoding: ngram (prompt lookup, no second model; the "
        "default), draft (guesses from --draft-model) or off. Adaptive: each sequence drafts only "
        "while its measured acceptance and this device's measured verify cost say it pays, and "
        "never while the scheduler cuts load; where it cannot pay it costs nothing but a "
        "one-time calibration of the verify step (in idle time after ready, kept per model)."
    )
    draft_model: str | None = Field(
        None, description="Draft model for --speculative draft (store name or .gguf path); it must "
        "have the served model's vocabulary."
    )
    draft_max: int = Field(DEFAULT_DRAFT_MAX, ge=1, le=DRAFT_MAX_LIMIT, description="Most tokens drafted per "
                           "sequence and step (the step plan drafts fewer wherever more does not pay).")
    prompt_cache_mib: int = Field(
        DEFAULT_PROMPT_CACHE_MIB, ge=0, le=1 << 20, description="Host memory (MiB) for prompt caches "
        "moved out of the KV cache when another request takes a slot, restored when a prompt starts "
        "like one of them; 0 keeps idle caches in the KV cache (where they slow every step). Never "
        "more than the memory plan leaves free."
    )
    flash_attn: FlashAttn = Field(
        DEFAULT_FLASH_ATTN, description="Flash attention. auto: llama.cpp's choice (on wherever the "
        "backend has it). fastest: with the weights on the CPU and an f16 KV cache, edge times both "
        "kinds once on this device and keeps the faster (the verdict is cached); without flash "
        "attention greedy output may then change with batching (speculation, prompt-cache hits). A "
        "quantized KV cache always uses it."
    )

    # --- server ---
    host: str = Field("127.0.0.1", description="Bind address; non-loopback needs an API key.")
    port: int = Field(8088, ge=0, le=65535, description="TCP port (0: any free port).")
    api_key: str | None = Field(None, description="Bearer key (env EDGE_API_KEY).", repr=False)
    api_key_file: Path | None = Field(None, description="File holding the bearer key.")
    insecure: bool = Field(False, description="Allow a non-loopback bind without an API key.")
    max_queue: int = Field(64, ge=0, le=100_000, description="Requests allowed to wait.")
    max_tokens_cap: int = Field(4096, ge=1, le=1 << 20, description="Upper bound on max_tokens.")
    max_body_bytes: int = Field(4 << 20, ge=1024, le=1 << 30, description="Largest request body accepted.")
    cors_origins: list[str] = Field(default_factory=list, description="CORS origins (empty: off).")
    log_prompts: bool = Field(False, description="Log prompts and outputs (debug only).")
    sse_ping_s: float = Field(
        15.0, ge=0, le=3600, description="SSE keep-alive comment interval while a stream is silent "
        "(waiting for a slot or a long prompt); 0 disables."
    )
    agent_port: int | None = Field(
        None, ge=1, le=65535, description="TCP port of the HAProxy agent check: answers each connection "
        "with this box's weight ('up 60%'), 'drain' or 'down' (None: off). See README \"Several boxes\"."
    )
    agent_host: str | None = Field(
        None, description="Bind address of the agent check (None: 127.0.0.1); a non-loopback address "
        "needs an API key, as the API does."
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, le=3600, description="Time running requests get to finish on SIGTERM."
    )
    keep_alive_s: float | None = Field(
        DEFAULT_KEEP_ALIVE_S, ge=0, description="Unload a model after this idle time: seconds or a "
        "duration such as 5m or 1h (default 5m, Ollama's; None or a negative duration: never). A "
        "request's keep_alive overrides it for its model."
    )

    # --- model host: several models from one endpoint ---
    memory_budget_bytes: int | None = Field(
        None, ge=0, description="Memory the resident models may hold together, counted as `edge plan` "
        "counts a model (weights, KV, compute, overhead): bytes or a size such as 1300M or 4G. None: the "
        "memory available at start (MemAvailable, the cgroup limit) minus the reserve."
    )
    pin: list[str] = Field(
        default_factory=list, description="Models never unloaded to make room or after idle time "
        "(store names or paths)."
    )
    chat_template: str | None = Field(
        None, description="Chat template replacing the model's: a built-in name (chatml, chatml-tools, "
        "llama3, plain) or a Jinja file path. None: the model's own (plain transcript if it has none). "
        "chatml-tools gives a ChatML model (e.g. SmolLM2) Hermes-style tool calling."
    )

    # --- thinking models (edge.runtime.text.reasoning, edge.scheduler.reasoning) ---
    reasoning_format: ReasoningFormat = Field(
        DEFAULT_REASONING_FORMAT, description="How a think block is kept apart from the answer "
        "(llama-server's meanings): auto, the chat template's family (<think> tags, gpt-oss channels); "
        "deepseek, think tags into reasoning_content; deepseek-legacy, the same and the tags left in the "
        "content too; none, the text as the model wrote it."
    )
    reasoning_budget: int = Field(
        DEFAULT_REASONING_BUDGET, ge=-1, le=1 << 20, description="Thinking tokens before edge closes the "
        "block itself and the model answers (-1: unlimited; 0: thinking off where the template can turn "
        "it off). Under a thermal or power cut or on battery under the reserve the scheduler shrinks it "
        "(see /v1/status); a request may ask for less."
    )

    # --- /v1/responses store ---
    responses_store_max: int = Field(
        256, ge=0, le=100_000, description="Responses kept in memory for previous_response_id (0: none)."
    )
    responses_store_max_bytes: int = Field(
        64 << 20, ge=0, le=1 << 34, description="Bound on the size (JSON text) of the kept responses."
    )
    responses_store_ttl_s: float = Field(
        3600.0, gt=0.0, le=30 * 86400.0, description="Seconds a kept response stays retrievable."
    )

    # --- telemetry ---
    telemetry: str = Field(
        "auto", description="Telemetry source: auto, linux, jetson, macos, none, or sim:PROFILE[@SCALE] "
        "(a simulated device; @SCALE compresses time)."
    )
    calibration: str | None = Field(
        None, description="Measured decode throughput (a name in configs/throughput or a JSON path, "
        "written by `python -m edge.tools.calibrate`): the thermal ladder then drops settings that "
        "cost more heat for no more tokens. With sim:PROFILE telemetry the simulator's own is used."
    )
    sim_ambient_file: Path | None = Field(
        None, description="With sim: telemetry, a file holding the simulated room temperature in C, "
        "re-read as it changes: `echo 60 > FILE` heats the box up at run time (demos, balancer tests)."
    )
    sysfs_root: Path = Field(Path("/sys"), description="Root of the sysfs tree to read.")
    power_budget_w: float | None = Field(
        None, gt=0, le=10_000, description="Power budget in watts the scheduler holds (beats the nvpmodel "
        "mode's and the profile's; None: those, if any)."
    )
    battery_power_budget_w: float | None = Field(
        None, gt=0, le=10_000, description="Power budget in watts while on battery (beats the profile's; "
        "None: the profile's battery_power_budget_w, if any)."
    )
    battery_reserve_pct: float = Field(
        20.0, ge=0, le=100, description="On battery below this charge, background work waits; "
        "interactive work keeps running."
    )
    procfs_root: Path = Field(Path("/proc"), description="Root of the procfs tree to read.")

    # --- operations: the audit trail and the record of every start ---
    audit_log: Path | None = Field(
        None, description="Append one JSON line per HTTP request to this file: time, request id, client, "
        "API key name, method, path, model, status, tokens, duration; never prompt or answer text "
        "(None: off). Rotated by size, appended to across restarts."
    )
    audit_log_max_mib: int = Field(64, ge=1, le=1 << 20, description="Size (MiB) at which the audit "
                                   "log rotates to FILE.1 (the older ones to FILE.2 ...).")
    audit_log_backups: int = Field(3, ge=1, le=1000, description="Rotated audit files kept.")
    state_dir: Path | None = Field(
        None, description="Where edge keeps its records (deployments/: one JSON file per `edge serve` "
        "start). None: the per-user state directory (env EDGE_STATE_DIR)."
    )
    # --- the inference probe (/health/inference) ---
    probe_interval_s: float = Field(
        60.0, ge=0, le=86400, description="While idle, run a one-token inference probe this often; the "
        "systemd watchdog is fed only while probes pass (0: no periodic probe)."
    )
    probe_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="A probe with no token within this time fails (503)."
    )
    # field -> default | profile | file | environment | flag, set by commands/_common.settings_from_args
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = os.environ.get("EDGE_CONFIG") or str(CONFIGS_DIR / "edge.toml")
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls, toml_file=toml_path),
        )

    @field_validator("keep_alive_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        """"5m", "1h30m", "-1" (never) as Ollama's keep_alive; a plain number is seconds."""
        if value is None or isinstance(value, bool):
            return value
        try:
            return parse_keep_alive(value if not isinstance(value, str) or value.strip() else "0",
                                    "keep_alive")
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None

    @field_validator("memory_budget_bytes", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        try:
            return parse_bytes(value if isinstance(value, str) else int(value), "memory_budget")
        except (InvalidRequest, TypeError) as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _draft_needs_model(self) -> Settings:
        if self.speculative == "draft" and not self.draft_model:
            raise ValueError("speculative = 'draft' needs draft_model (--draft-model NAME)")
        return self

    def resolved_api_key(self) -> str | None:
        """The key a client sends: `api_key`, else the first key of `api_key_file`."""
        return next(iter(self.resolved_api_keys().values()), None)

    def resolved_api_keys(self) -> dict[str, str]:
        """Key name -> key the server accepts: `api_key` as "default", else `api_key_file`, one
        `name:key` a line (a lone line without a colon is the key "default"; blank lines and
        `#` comments skipped), so the audit trail can say who called."""
        if self.api_key:
            return {"default": self.api_key}
        if self.api_key_file is None:
            return {}
        try:
            lines = [ln.strip() for ln in self.api_key_file.read_text().splitlines()]
        except OSError as exc:
            raise ConfigError("api_key_file", str(exc)) from exc
        lines = [ln for ln in lines if ln and not ln.startswith("#")]
        if len(lines) == 1 and ":" not in lines[0]:
            return {"default": lines[0]}
        keys: dict[str, str] = {}
        for n, line in enumerate(lines, 1):
            name, _, key = (part.strip() for part in line.partition(":"))
            if not name or not key or name in keys or key in keys.values():
                raise ConfigError("api_key_file", f"{self.api_key_file}: entry {n} is not a new name:key")
            keys[name] = key
        return keys

    def origins(self) -> dict[str, str]:
        """Where each field's value came from (empty unless read by `settings_from_args`)."""
        return dict(self._origins)

    def set_origins(self, origins: dict[str, str]) -> None:
        self._origins = dict(origins)

    def resolved_state_dir(self) -> Path:
        """`state_dir`, else the per-user state directory (records that outlive one run)."""
        if self.state_dir is not None:
            return self.state_dir
        import platformdirs

        return Path(platformdirs.user_state_dir("edge", appauthor=False))


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build settings from defaults, TOML, env and `overrides` (CLI flags; None values skipped)."""
    kwargs = {k: v for k, v in overrides.items() if v is not None}
    old = os.environ.get("EDGE_CONFIG")
    try:
        if config_file is not None:
            if not config_file.is_file():
                raise ConfigError("config", f"no such file: {config_file}")
            os.environ["EDGE_CONFIG"] = str(config_file)
        return Settings(**kwargs)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        raise ConfigError(".".join(str(p) for p in err["loc"]) or "settings", msg) from exc
    finally:
        if config_file is not None:
            if old is None:
                os.environ.pop("EDGE_CONFIG", None)
            else:
                os.environ["EDGE_CONFIG"] = old


def list_profiles(profiles_dir: Path = PROFILES_DIR) -> list[str]:
    return sorted(p.stem for p in profiles_dir.glob("*.toml"))


def load_profile(name: str, profiles_dir: Path = PROFILES_DIR) -> DeviceProfile:
    path = profiles_dir / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(list_profiles(profiles_dir))
        raise ConfigError("profile", f"unknown profile {name!r}; known: {known}")
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    try:
        return DeviceProfile(name=name, **data)
    except TypeError as exc:
        raise ConfigError("profile", f"{path}: {exc}") from exc


def resolve_profile(name: str | None, sysfs_root: Path | None = None, procfs_root: Path | None = None,
                    detect: Callable[[], str] | None = None) -> DeviceProfile:
    """The one place a device profile is chosen: `name`, else the one that fits the detected
    platform (`detect` replaces the detection in tests). ConfigError names an unknown profile."""
    if name is None:
        from edge.platforms import detected_profile_name

        name = detect() if detect is not None else detected_profile_name(sysfs_root, procfs_root)
    return load_profile(name)
