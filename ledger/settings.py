"""Where the ledger's Redis lives, read from `IRREV_*` environment variables."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class AppendFsync(StrEnum):
    """Redis AOF fsync policy: what an acknowledged write survives.

    `always`: fsync before every reply, so an acknowledged hold survives a crash of
    redis-server or of the machine. `everysec`: up to about one second of
    acknowledged writes can be lost on a machine crash (and on kill -9 only what
    the kernel had not yet been handed). A lost debit is an overdraw, so `always`
    is the default.
    """

    ALWAYS = "always"
    EVERYSEC = "everysec"


REDIS_SCHEMES = ("redis", "rediss", "unix")  # what redis-py's from_url accepts


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "irrev"


class LedgerSettings(BaseSettings):
    """`IRREV_REDIS_URL` set: use that server. Unset: start (or join) an embedded one."""

    model_config = SettingsConfigDict(env_prefix="IRREV_", extra="ignore")

    redis_url: str | None = Field(
        default=None, description="redis:// or unix:// URL; unset starts an embedded server"
    )
    data_dir: Path = Field(
        default_factory=default_data_dir, description="where the embedded server keeps its AOF"
    )
    appendfsync: AppendFsync = AppendFsync.ALWAYS
    redis_server: str | None = Field(
        default=None, description="redis-server binary for the embedded server"
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str | None) -> str | None:
        """Refused here, by `irrev serve` at start, rather than by each worker's client."""
        if url and url.split("://", 1)[0] not in REDIS_SCHEMES:
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return url
