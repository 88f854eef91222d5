"""Reading a YAML configuration file into the validated model."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from amps_on_kafka.config.model import Config
from amps_on_kafka.errors import ConfigError


def load_config(path: str | Path) -> Config:
    """Load and validate; every error names the file and the offending key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: can't read the configuration: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(raw).__name__}")
    raw = {section: body for section, body in raw.items() if body is not None}  # empty sections
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from exc
    return _resolve_schema_paths(config, path.parent)


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where.lstrip('.') or 'top level'}: {message}")
    return "; ".join(parts)


def _resolve_schema_paths(config: Config, base: Path) -> Config:
    """Avro schema paths are relative to the file that names them."""
    topics = tuple(
        t.model_copy(update={"schema_path": (base / t.schema_path).resolve()})
        if t.schema_path is not None and not t.schema_path.is_absolute()
        else t
        for t in config.topics
    )
    return config.model_copy(update={"topics": topics})
