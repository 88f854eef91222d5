"""`amps-kafka users`: the gateway's users file (Authentication: UsersFile).

A password is read from a prompt (asked twice) or, with --password-stdin, from the first
line of standard input; never from the command line, where `ps` and shell histories
would show it. The gateway reads the file again when it changes: no restart needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from amps_on_kafka.cli.common import reports_errors
from amps_on_kafka.errors import ConfigError
from amps_on_kafka.security.users import UsersFile

file_option = click.option(
    "--file",
    "path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The users file (the configuration's Authentication: UsersFile).",
)


@click.group()
def users() -> None:
    """Manage the gateway's users file (salted argon2 password hashes)."""


@users.command()
@click.argument("name")
@file_option
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@reports_errors
def add(name: str, path: Path, password_stdin: bool) -> None:
    """Add NAME, or change its password."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise ConfigError("the password must not be empty")
    new = UsersFile(path).add(name, password)
    click.echo(f"{'added' if new else 'changed the password of'} {name} in {path}", err=True)


@users.command()
@click.argument("name")
@file_option
@reports_errors
def remove(name: str, path: Path) -> None:
    """Remove NAME."""
    UsersFile(path).remove(name)
    click.echo(f"removed {name} from {path}", err=True)


@users.command(name="list")
@file_option
@reports_errors
def list_users(path: Path) -> None:
    """Print the users' names, one a line."""
    if not path.exists():  # a mistyped path must not look like a file without users
        raise ConfigError(f"{path} does not exist (users add creates it)")
    for name in sorted(UsersFile(path).hashes()):
        click.echo(name)
