"""SOW semantics (issue 4, item 2): keys, publish, delta_publish, sow_delete."""

import pytest

from amps_on_kafka.state.events import ChangeKind
from tests.sow.rules_helpers import Log


def test_publish_replaces_the_whole_record():
    log = Log()
    log.publish(1000, {"id": 1, "a": 1, "b": 2})
    log.publish(1001, {"id": 1, "c": 3})
    assert log.view() == {"1": {"id": 1, "c": 3}}


def test_delta_publish_overwrites_present_fields_and_adds_new_ones():
    log = Log()
    log.publish(1000, {"id": 1, "a": 1, "b": 2})
    log.delta(1001, {"id": 1, "b": 20, "c": 3})
    assert log.view() == {"1": {"id": 1, "a": 1, "b": 20, "c": 3}}


def test_delta_publish_replaces_nested_objects_and_arrays_whole():
    log = Log()
    log.publish(1000, {"id": 1, "o": {"x": 1, "y": 2}, "l": [1, 2, 3]})
    log.delta(1001, {"id": 1, "o": {"x": 9}, "l": [4]})
    assert log.view()["1"] == {"id": 1, "o": {"x": 9}, "l": [4]}


def test_delta_publish_can_not_remove_a_field():
    log = Log()
    log.publish(1000, {"id": 1, "a": 1})
    log.delta(1001, {"id": 1})
    assert log.view()["1"] == {"id": 1, "a": 1}


def test_delta_publish_with_no_existing_record_acts_as_a_publish():
    log = Log()
    log.delta(1000, {"id": 5, "a": 1})
    assert log.view() == {"5": {"id": 5, "a": 1}}


def test_composite_keys_from_several_paths():
    log = Log(key=["/55", "/109"])
    log.publish(1000, {"55": "IBM", "109": 1, "px": 1})
    log.publish(1001, {"55": "IBM", "109": 2, "px": 2})
    log.publish(1002, {"55": "IBM", "109": 1, "px": 3})
    assert sorted(r["px"] for r in log.view().values()) == [2, 3]


def test_a_message_missing_a_key_field_is_rejected_with_a_reason():
    log = Log()
    out = log.publish(1000, {"name": "no id"})
    assert log.view() == {}
    assert out.results[0].error == "message has no value for the SOW key field /id"


def test_a_payload_that_is_not_json_is_rejected_not_fatal():
    log = Log()
    out = log.publish(1000, b"{not json")
    assert "not valid JSON" in out.results[0].error
    log.publish(1001, {"id": 1})
    assert log.view() == {"1": {"id": 1}}


def test_an_explicit_sow_key_when_the_topic_takes_keys_from_the_publish():
    log = Log(KeyFromPublish=True)
    log.publish(1000, {"v": 1}, sow_key="K1")
    log.publish(1001, {"v": 2}, sow_key="K1")
    assert log.view() == {"K1": {"v": 2}}


def test_each_record_keeps_the_bookmark_and_timestamp_of_its_last_update():
    log = Log()
    log.publish(1000, {"id": 1, "a": 1})
    log.delta(2500, {"id": 1, "a": 2})
    record = log.state.get("1")
    assert (record.offset, record.timestamp, record.bookmark) == (1, 2500, "t|0|1|")


def test_sow_delete_by_filter_deletes_what_matches_and_counts_it():
    log = Log()
    for i in range(6):
        log.publish(1000 + i, {"id": i, "even": i % 2 == 0})
    out = log.delete(2000, filter="/even = true")
    assert out.results[0].deleted == 3
    assert sorted(log.view()) == ["1", "3", "5"]


def test_sow_delete_with_1_eq_1_deletes_everything():
    log = Log()
    for i in range(4):
        log.publish(1000 + i, {"id": i})
    assert log.delete(2000, filter="1=1").results[0].deleted == 4
    assert log.view() == {}


def test_sow_delete_by_keys_and_by_data():
    log = Log()
    for i in range(4):
        log.publish(1000 + i, {"id": i})
    assert log.delete(2000, sow_keys=("0", "2", "99")).results[0].deleted == 2
    assert log.delete(2001, data={"id": 3, "whatever": 1}).results[0].deleted == 1
    assert sorted(log.view()) == ["1"]


def test_a_bad_filter_on_the_log_is_rejected_with_its_reason():
    log = Log()
    log.publish(1000, {"id": 1})
    out = log.delete(2000, filter="/id = = 1")
    assert out.results[0].error and "position" in out.results[0].error
    assert sorted(log.view()) == ["1"]


def test_changes_name_the_old_and_new_record():
    log = Log()
    first = log.publish(1000, {"id": 1, "a": 1}).changes[0]
    second = log.publish(1001, {"id": 1, "a": 2}).changes[0]
    deleted = log.delete(1002, sow_keys=("1",)).changes[0]
    assert (first.kind, first.old) == (ChangeKind.UPSERT, None)
    assert second.old.data == {"id": 1, "a": 1} and second.new.data == {"id": 1, "a": 2}
    assert (deleted.kind, deleted.old.data, deleted.new) == (
        ChangeKind.DELETE,
        {"id": 1, "a": 2},
        None,
    )


@pytest.mark.parametrize("command", ["publish", "delta"])
def test_updates_never_cross_keys(command):
    log = Log()
    log.publish(1000, {"id": 1, "a": 1})
    getattr(log, command)(1001, {"id": 2, "b": 2})
    assert log.view() == {"1": {"id": 1, "a": 1}, "2": {"id": 2, "b": 2}}
