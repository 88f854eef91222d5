"""Seed 000, per-message lifetime: every rule of the seed is a test here."""

from amps_on_kafka.config import SowConfig
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.state.events import ChangeKind
from amps_on_kafka.state.record import NEVER
from amps_on_kafka.state.sow import SowRules
from tests.sow.rules_helpers import Log


def test_expiration_is_disabled_by_default_so_nothing_expires():
    log = Log()
    log.publish(1000, {"id": 1}, expiration=1)
    assert log.sweep(10**9) == []
    assert log.view(10**9) == {"1": {"id": 1}}


def test_disabled_expiration_still_preserves_the_message_expiration():
    log = Log()
    log.publish(1000, {"id": 1}, expiration=5)
    assert log.state.get("1").deadline == 6000


def test_topic_default_applies_to_messages_without_an_expiration():
    log = Log(expiration="30s")
    log.publish(1000, {"id": 1})
    assert log.state.get("1").deadline == 31_000


def test_a_message_expiration_overrides_the_topic_default():
    log = Log(expiration="30s")
    log.publish(1000, {"id": 1}, expiration=5)
    assert log.state.get("1").deadline == 6000


def test_a_message_expiration_of_zero_means_never():
    log = Log(expiration="30s")
    log.publish(1000, {"id": 1}, expiration=0)
    assert log.state.get("1").deadline == NEVER
    assert log.sweep(10**12) == []


def test_no_message_and_no_topic_expiration_means_the_record_never_expires():
    log = Log(expiration="enabled")
    log.publish(1000, {"id": 1})
    assert log.state.get("1").deadline == NEVER


def test_enabled_expires_only_messages_that_carry_an_expiration():
    log = Log(expiration="enabled")
    log.publish(1000, {"id": 1}, expiration=2)
    log.publish(1000, {"id": 2})
    expired = log.sweep(3000)
    assert [c.sow_key for c in expired] == ["1"]
    assert log.view(3000) == {"2": {"id": 2}}


def test_every_update_resets_the_lifetime_from_that_updates_timestamp():
    log = Log(expiration="45s")
    log.publish(0, {"id": 1})
    log.delta(15_000, {"id": 1, "a": 1})
    assert log.state.get("1").deadline == 60_000
    assert log.sweep(50_000) == []
    assert [c.kind for c in log.sweep(60_000)] == [ChangeKind.EXPIRE]


def test_expiry_is_delete_processing_with_a_change_carrying_the_old_record():
    log = Log(expiration="1s")
    log.publish(0, {"id": 1, "a": 1})
    (change,) = log.sweep(1000)
    assert (change.kind, change.old.data, change.new) == (
        ChangeKind.EXPIRE,
        {"id": 1, "a": 1},
        None,
    )
    assert log.state.get("1") is None


def test_queries_stop_returning_a_record_at_its_deadline_even_before_the_sweep():
    log = Log(expiration="1s")
    log.publish(0, {"id": 1})
    assert log.view(999) == {"1": {"id": 1}}
    assert log.view(1000) == {}


def test_an_update_after_the_deadline_starts_a_new_record_not_a_merge():
    """The SOW is a function of the log: an expired record is gone whenever the sweep ran."""
    log = Log(expiration="1s")
    log.publish(0, {"id": 1, "old": True})
    out = log.delta(5000, {"id": 1, "new": True})
    assert [c.kind for c in out.changes] == [ChangeKind.EXPIRE, ChangeKind.UPSERT]
    assert log.view() == {"1": {"id": 1, "new": True}}


def test_the_deadline_is_stored_and_not_recomputed_when_the_default_changes():
    log = Log(expiration="30s")
    log.publish(0, {"id": 1})
    stored = log.state.get("1")
    changed = SowRules(
        SowConfig.model_validate({"Topic": "t", "Key": "/id", "Expiration": "5s"}), JSON
    )
    assert stored.deadline == 30_000
    assert not changed.is_expired(stored, 10_000)
    assert changed.is_expired(stored, 30_000)


def test_disabling_expiration_in_the_config_stops_expiry_processing():
    log = Log(expiration="1s")
    log.publish(0, {"id": 1})
    disabled = SowRules(SowConfig.model_validate({"Topic": "t", "Key": "/id"}), JSON)
    stored = log.state.get("1")
    assert not disabled.is_expired(stored, 10**9)
    assert disabled.expire(log.state, "1", 10**9) is None


def test_enabling_expiration_later_honours_deadlines_stored_while_disabled():
    log = Log()
    log.publish(0, {"id": 1}, expiration=2)
    enabled = SowRules(
        SowConfig.model_validate({"Topic": "t", "Key": "/id", "Expiration": "enabled"}), JSON
    )
    assert enabled.expire(log.state, "1", 2000).kind is ChangeKind.EXPIRE


def test_a_delete_of_an_already_expired_record_reports_it_expired_not_deleted():
    log = Log(expiration="1s")
    log.publish(0, {"id": 1})
    out = log.delete(5000, sow_keys=("1",))
    assert out.results[0].deleted == 0
    assert [c.kind for c in out.changes] == [ChangeKind.EXPIRE]
