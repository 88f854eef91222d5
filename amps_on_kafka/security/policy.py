"""The gateway's security policy in one object: who may log on, what each user may do,
and the throttle on failed logons; built from a configuration, or open for embedding."""

from __future__ import annotations

from dataclasses import dataclass, field

from amps_on_kafka.config.model import AuthenticationConfig, Config
from amps_on_kafka.security.auth import Authentication, Throttle
from amps_on_kafka.security.entitlements import Entitlements


@dataclass(frozen=True)
class Security:
    authentication: Authentication
    entitlements: Entitlements = field(default_factory=lambda: Entitlements(None))
    throttle: Throttle = field(default_factory=lambda: Throttle(0.5, 30.0))

    @classmethod
    def from_config(cls, config: Config) -> Security:
        """The configuration's Authentication and Entitlements: nobody may log on unless
        they say how (the default configuration refuses every logon)."""
        auth: AuthenticationConfig = config.authentication
        return cls(
            Authentication.from_config(auth),
            Entitlements(config.entitlements),
            Throttle(auth.failure_delay, auth.max_failure_delay),
        )

    @classmethod
    def open(cls) -> Security:
        """Anyone, anonymously, may do anything: what a Gateway built in code without a
        configuration gets (tests, embedding). The worker always passes from_config."""
        return cls(Authentication.open())
