"""Reading a YAML configuration file into the validated model."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from amps_on_kafka.config.model import Config
from amps_on_kafka.errors import ConfigError

# A configuration is a few KiB. Read at most this much: `--config /dev/zero` (or a log
# file given by mistake) must be an error, not a process that reads until memory ends.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_ERRORS_SHOWN = 10  # of a file wrong everywhere, the first few make the point


class InvalidConfig(ConfigError):
    """A file whose content does not validate. Its message shows the first
    MAX_ERRORS_SHOWN problems; `problems` has every one (`amps-kafka config check`)."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        shown = problems[:MAX_ERRORS_SHOWN]
        if len(problems) > MAX_ERRORS_SHOWN:
            shown.append(f"and {len(problems) - MAX_ERRORS_SHOWN} more errors")
        super().__init__(f"{path}: {'; '.join(shown)}")
        self.problems = problems


def load_config(path: str | Path) -> Config:
    """Load and validate; every error names the file and the offending key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(_read(path))
    except OSError as exc:
        raise ConfigError(f"{path}: can't read the configuration: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at {exc.start})"
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from exc
    except RecursionError as exc:  # PyYAML's parser recurses once per level of nesting
        raise ConfigError(f"{path}: not a configuration: nested too deeply") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(raw).__name__}")
    raw = {section: body for section, body in raw.items() if body is not None}  # empty sections
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        raise InvalidConfig(path, _problems(exc)) from exc
    return _resolve_security_paths(_resolve_schema_paths(config, path.parent), path.parent)


def _read(path: Path) -> str:
    with path.open("rb") as file:
        data = file.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes: not a configuration")
    return data.decode("utf-8")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: the problem and where (PyYAML's own text spans lines with a snippet)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def _problems(exc: ValidationError) -> list[str]:
    """Each error on one line: `Topics[0].Partitions: <why>`."""
    problems = []
    for error in exc.errors():
        where = "".join(_location(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ").replace("\n", "\\n")
        problems.append(f"{where.lstrip('.') or 'top level'}: {message}")
    return problems


def _location(part: int | str) -> str:
    """`[0]` for a list index, `.Key` for a key; a key that isn't a plain word (a
    misspelt key can be anything YAML allows, a newline included) in quotes."""
    if isinstance(part, int):
        return f"[{part}]"
    return f".{part}" if re.fullmatch(r"\w+", part) else f"[{part!r}]"


def _resolve_schema_paths(config: Config, base: Path) -> Config:
    """Avro schema paths are relative to the file that names them."""
    topics = tuple(
        t.model_copy(update={"schema_path": (base / t.schema_path).resolve()})
        if t.schema_path is not None and not t.schema_path.is_absolute()
        else t
        for t in config.topics
    )
    return config.model_copy(update={"topics": topics})


def _resolve_security_paths(config: Config, base: Path) -> Config:
    """The gateway's TLS files and the users file are relative to the configuration too."""
    tls = config.gateway.tls
    if tls is not None:
        tls = tls.model_copy(
            update={
                name: _relative_to(base, getattr(tls, name))
                for name in ("certificate", "key", "ca")
                if getattr(tls, name) is not None
            }
        )
        config = config.model_copy(
            update={"gateway": config.gateway.model_copy(update={"tls": tls})}
        )
    users = config.authentication.users_file
    if users is not None:
        authentication = config.authentication.model_copy(
            update={"users_file": _relative_to(base, users)}
        )
        config = config.model_copy(update={"authentication": authentication})
    return config


def _relative_to(base: Path, path: Path) -> Path:
    return path if path.is_absolute() else (base / path).resolve()
