"""Configuration: YAML in AMPS vocabulary, validated at load."""

from amps_on_kafka.config.durations import parse_duration
from amps_on_kafka.config.fields import check_topic_name
from amps_on_kafka.config.loader import load_config
from amps_on_kafka.config.model import (
    Config,
    Expiration,
    GatewayConfig,
    MessageType,
    SowConfig,
    TopicConfig,
    check_key_path,
    check_listen,
)
from amps_on_kafka.config.queues import QueueConfig

__all__ = [
    "Config",
    "Expiration",
    "GatewayConfig",
    "MessageType",
    "QueueConfig",
    "SowConfig",
    "TopicConfig",
    "check_key_path",
    "check_listen",
    "check_topic_name",
    "load_config",
    "parse_duration",
]
