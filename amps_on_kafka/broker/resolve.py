"""Where is Kafka? The one rule every command that needs a broker follows."""

from __future__ import annotations

import os
from collections.abc import Callable

from amps_on_kafka.broker.local import LocalBroker

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


def resolve_bootstrap(explicit: str | None, *, echo: Callable[[str], None] | None = None) -> str:
    """The bootstrap servers to use: ``explicit`` if given, else ``$KAFKA_BOOTSTRAP_SERVERS``,
    else the local broker (default data directory), started if it isn't running.

    Starting a broker is announced through ``echo`` so a user never wonders where a JVM came
    from; reusing a running one is silent.
    """
    if explicit:
        return explicit
    from_env = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if from_env:
        return from_env
    broker = LocalBroker(echo=echo)
    was_running = broker.status().running
    bootstrap = broker.start()
    if echo and not was_running:
        echo(f"no --bootstrap given; started local Kafka broker at {bootstrap}")
    return bootstrap
