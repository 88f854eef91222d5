"""A real Apache Kafka broker wherever the project runs.

``resolve_bootstrap`` is the embedded default of every command that needs Kafka: an explicit
address, else ``$KAFKA_BOOTSTRAP_SERVERS``, else a single-node KRaft broker that
``LocalBroker`` runs from Apache Kafka's own jars (fetched once from Maven Central).
"""

from amps_on_kafka.broker.errors import BrokerError
from amps_on_kafka.broker.jars import KAFKA_VERSION, cache_dir, fetch_jars
from amps_on_kafka.broker.local import BrokerStatus, LocalBroker, default_data_dir
from amps_on_kafka.broker.resolve import BOOTSTRAP_ENV, resolve_bootstrap

__all__ = [
    "BOOTSTRAP_ENV",
    "KAFKA_VERSION",
    "BrokerError",
    "BrokerStatus",
    "LocalBroker",
    "cache_dir",
    "default_data_dir",
    "fetch_jars",
    "resolve_bootstrap",
]
