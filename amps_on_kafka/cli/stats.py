"""`amps-kafka stats`: a worker's admin view (its admin port's /admin) as tables."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any
from urllib.error import URLError
from urllib.parse import unquote, urlsplit
from urllib.request import Request, urlopen

import click

from amps_on_kafka.cli.common import reports_errors

TIMEOUT = 10.0  # seconds


@click.command()
@click.option(
    "--server",
    required=True,
    metavar="URL",
    help="The worker's admin port, http://HOST:PORT (http://USER:PASSWORD@HOST:PORT when "
    "its gateway asks for a logon).",
)
@click.option(
    "--format", "output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@reports_errors
def stats(server: str, output: str) -> None:
    """Show a worker's instance, SOW topics, clients, subscriptions and queues."""
    view = fetch(server)
    if output == "json":
        click.echo(json.dumps(view, indent=2))
        return
    for title, headers, rows in sections(view):
        click.echo(f"{title}\n{table(headers, rows)}\n")


def fetch(server: str) -> dict[str, Any]:
    """The /admin view; `http://USER:PASSWORD@HOST:PORT` logs on as the gateway would
    (HTTP Basic), as tcp:// URIs do."""
    parts = urlsplit(server.strip() if "://" in server else f"http://{server.strip()}")
    if parts.scheme not in ("http", "https"):
        raise click.BadParameter(
            f"{server!r} is not an admin port's URL: give http://HOST:PORT (the worker's "
            "Admin: Listen; a tcp:// URI is its gateway's)",
            param_hint="'--server'",
        )
    where = parts.netloc.rpartition("@")[2]  # never the password, in errors too
    url = f"{parts.scheme}://{where}{parts.path.rstrip('/')}/admin"
    request = Request(url)
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        request.add_header("Authorization", f"Basic {base64.b64encode(pair).decode()}")
    try:
        with urlopen(request, timeout=TIMEOUT) as response:
            return json.load(response)
    except (URLError, OSError, ValueError) as exc:
        raise click.ClickException(f"can't read the admin view at {url}: {exc}") from exc


def sections(view: dict[str, Any]) -> list[tuple[str, list[str], list[Sequence[Any]]]]:
    """(title, column headings, rows) of each table."""
    instance, worker, gateway = view["instance"], view["worker"], view["gateway"] or {}
    return [
        (
            "Instance",
            ["version", "uptime s", "group", "gateway", "applied", "expired", "failed"],
            [
                [
                    instance["version"],
                    instance["uptime_seconds"],
                    instance["group"],
                    instance["gateway"],
                    worker["applied"],
                    worker["expired"],
                    worker["failed"] or "",
                ]
            ],
        ),
        (
            "SOW topics",
            ["topic", "records", "partitions", "lag"],
            [
                [t["topic"], t["records"], _partitions(t["partitions"]), t["lag"]]
                for t in view["sow_topics"]
            ],
        ),
        (
            "Clients",
            ["name", "user", "address", "subs", "frames in/out", "bytes in/out", "queued"],
            [
                [
                    c["name"],
                    c["user"] or "",
                    c["address"],
                    len(c["subscriptions"]),
                    f"{c['frames_in']}/{c['frames_out']}",
                    f"{c['bytes_in']}/{c['bytes_out']}",
                    f"{c['slow_consumer']:.0%}",
                ]
                for c in view["clients"]
            ],
        ),
        (
            "Subscriptions",
            ["client", "sub_id", "kind", "topic", "filter"],
            [
                [s["client"], s["sub_id"], s["kind"], s["topic"], s["filter"] or ""]
                for s in view["subscriptions"]
            ],
        ),
        (
            "Queues",
            ["queue", "depth", "leased", "delivered", "acked", "expired", "leases by subscriber"],
            [
                [
                    q["name"],
                    q["depth"],
                    q["leased"],
                    q["delivered"],
                    q["ack"],
                    q["expire"],
                    _leases(q["subscribers"]),
                ]
                for q in view["queues"]
            ],
        ),
        (
            "Gateway",
            ["sessions", "connections", "slow consumers", "frames in/out", "bytes in/out"],
            [
                [
                    gateway.get("sessions", ""),
                    gateway.get("connections", ""),
                    gateway.get("slow_consumers", ""),
                    f"{gateway.get('frames_in', '')}/{gateway.get('frames_out', '')}",
                    f"{gateway.get('bytes_in', '')}/{gateway.get('bytes_out', '')}",
                ]
            ]
            if gateway
            else [],
        ),
    ]


def _leases(subscribers: list[dict[str, Any]]) -> str:
    return ", ".join(f"{s['client']}/{s['sub_id']}: {s['leases']}" for s in subscribers)


def _partitions(partitions: list[dict[str, Any]]) -> str:
    """`partition@applied offset` each (`-`: nothing applied yet)."""
    return " ".join(f"{p['partition']}@{_or_dash(p['applied'])}" for p in partitions)


def _or_dash(value: Any) -> Any:
    return "-" if value is None else value


def _printable(text: str) -> str:
    """Control characters escaped (`\\x1b`, `\\n`): a subscription's filter or sub_id is
    what a client sent, and printed raw it could move the cursor or recolour the
    operator's terminal, or break the table's lines."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def table(headers: list[str], rows: list[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; `(none)` for an empty table."""
    if not rows:
        return "  (none)"
    cells = [headers, *([_printable(str(v)) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in cells
    ]
    return "\n".join(line.rstrip() for line in lines)
