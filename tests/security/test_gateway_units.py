"""The gateway's security parts on their own, without Kafka: the logon throttle, the
users file and its CLI, entitlement resolution, the config sections, tcps:// URIs."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.cli import main
from amps_on_kafka.cli.worker import _warn_about_logons
from amps_on_kafka.client.uri import parse_uri, shown
from amps_on_kafka.config import Config, load_config
from amps_on_kafka.errors import ConfigError, TransportError
from amps_on_kafka.security import users as users_module
from amps_on_kafka.security.auth import (
    FORGET_AFTER,
    MAX_THROTTLED,
    Authentication,
    CertificateAuthenticator,
    Credentials,
    LogonFailed,
    PasswordAuthenticator,
    Throttle,
)
from amps_on_kafka.security.entitlements import CACHED_TOPICS, Denied, Entitlements
from amps_on_kafka.security.policy import no_logon_note
from amps_on_kafka.security.users import UsersFile


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_throttle_doubles_per_failure_up_to_its_cap() -> None:
    clock = Clock()
    throttle = Throttle(0.5, 4.0, clock)
    assert throttle.reserve(["address a"]) == 0  # no failure yet: no wait
    waits = []
    for _ in range(6):
        throttle.failed(["address a"])
        waits.append(throttle.reserve(["address a"]))
        clock.now += 100  # waited out; the count stays (FORGET_AFTER is longer)
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    clock.now += FORGET_AFTER  # 15 minutes after its last attempt: forgotten
    throttle.failed(["address b"])  # (the throttle forgets as it records)
    assert len(throttle) == 1 and throttle.reserve(["address a"]) == 0


def test_parallel_attempts_queue_one_delay_apart_and_success_clears_the_user() -> None:
    clock = Clock()
    throttle = Throttle(1.0, 10.0, clock)
    throttle.failed(["address a", "user bob"])
    throttle.failed(["address a", "user bob"])  # two failures: delay 2 s
    waits = [throttle.reserve(["address b", "user bob"]) for _ in range(3)]
    assert waits == [2.0, 4.0, 6.0]  # another address guessing bob waits in line too
    throttle.succeeded("user bob")
    assert throttle.reserve(["address c", "user bob"]) == 0


def test_the_throttle_forgets_the_oldest_keys_beyond_its_bound() -> None:
    clock = Clock()
    throttle = Throttle(1.0, 10.0, clock)
    for n in range(MAX_THROTTLED + 50):
        throttle.failed([f"address {n}"])
    assert len(throttle) <= MAX_THROTTLED
    assert throttle.reserve(["address 0"]) == 0  # the oldest went first
    assert throttle.reserve([f"address {MAX_THROTTLED + 49}"]) > 0


def test_the_users_file_holds_salted_hashes_only(tmp_path: Path) -> None:
    users = UsersFile(tmp_path / "users.txt")
    # "!" is outside the hashes' base64 alphabet: found only if stored as written
    password = "pw!"
    assert users.add("alice", password) and users.add("bob", password)
    text = users.path.read_text()
    assert password not in text
    alice, bob = (line.split(":", 1)[1] for line in text.splitlines())
    assert alice != bob  # the same password, salted apart
    assert stat.S_IMODE(users.path.stat().st_mode) == 0o600
    assert users.verify("alice", password) and not users.verify("alice", "PW!")
    assert not users.verify("nobody", password)
    assert not users.add("alice", "new")  # a new password, not a new user
    assert users.verify("alice", "new") and not users.verify("alice", password)
    users.remove("bob")
    assert set(users.hashes()) == {"alice"}
    with pytest.raises(ConfigError, match="no user 'bob'"):
        users.remove("bob")
    for bad in ("anonymous", "a:b", "", "a b", "_peer"):
        with pytest.raises(ConfigError):
            users.add(bad, "pw")


def test_a_running_gateway_sees_a_changed_password_at_once(tmp_path: Path) -> None:
    """The gateway's UsersFile re-reads a file another process rewrote, even when the
    new one has the old one's size and mtime (a password changed within one tick)."""
    path = tmp_path / "users.txt"
    served, admin = UsersFile(path), UsersFile(path)
    admin.add("alice", "old-password")
    assert served.verify("alice", "old-password")
    before = path.stat()
    admin.add("alice", "new-password")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the same tick
    assert path.stat().st_size == before.st_size
    assert served.verify("alice", "new-password") and not served.verify("alice", "old-password")
    admin.remove("alice")
    assert not served.verify("alice", "new-password")


def test_a_users_file_beyond_its_bound_is_refused(tmp_path: Path, monkeypatch) -> None:
    """MAX_USERS_FILE_BYTES (16 MiB, docs/security.md): a file past it is not read."""
    monkeypatch.setattr(users_module, "MAX_USERS_FILE_BYTES", 100)
    path = tmp_path / "users.txt"
    path.write_text("x" * 101)
    with pytest.raises(ConfigError, match="larger than 100 bytes"):
        UsersFile(path).hashes()


def test_a_damaged_users_file_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "users.txt"
    path.write_text("alice:$argon2id$v=19$x\nbob-without-hash\n")
    with pytest.raises(ConfigError, match="line 2"):
        UsersFile(path).hashes()


def test_authentication_asks_for_credentials_and_allows_anonymous_only_when_told(
    tmp_path: Path,
) -> None:
    users = UsersFile(tmp_path / "users.txt")
    users.add("alice", "pw")
    closed = Authentication([PasswordAuthenticator(users)], anonymous=False)
    with pytest.raises(LogonFailed, match="authentication required: user_id and pw"):
        closed.authenticate(Credentials(None))
    with pytest.raises(LogonFailed, match="needs user_id"):
        closed.authenticate(Credentials(None, "pw"))
    assert closed.authenticate(Credentials("alice", "pw")).user == "alice"
    nobody = Authentication([], anonymous=False)
    with pytest.raises(LogonFailed, match="accepts no logon"):
        nobody.authenticate(Credentials(None))
    open_ = Authentication([PasswordAuthenticator(users)], anonymous=True)
    assert open_.authenticate(Credentials(None)).anonymous
    with pytest.raises(LogonFailed):  # wrong credentials never fall back to anonymous
        open_.authenticate(Credentials("alice", "wrong"))
    with pytest.raises(LogonFailed):  # a certificate nobody trusts here is no identity
        nobody.authenticate(Credentials(None, certificate_subject="carol"))


def test_a_users_view_remembers_at_most_cached_topics() -> None:
    """An attacker may name any number of topics: each user's view caches CACHED_TOPICS
    answers at most."""
    grants = {"Users": {"alice": {"Read": ["t.*"], "Write": ["t.*"]}}}
    alice = _entitlements(grants).for_user("alice")
    for n in range(CACHED_TOPICS + 100):
        alice.read(f"t{n}")
        alice.may_write(f"t{n}")
    assert alice.read.cache_info().currsize == CACHED_TOPICS
    assert alice.may_write.cache_info().currsize == CACHED_TOPICS


@pytest.mark.parametrize("subject", ["_peer", "_anything", "anonymous"])
def test_a_certificate_cannot_name_the_gateways_own_users(subject: str) -> None:
    """A certificate the CA signed with CN=_peer would read everything as a peer does;
    CN=anonymous would pass for an anonymous session."""
    with pytest.raises(LogonFailed, match=f"certificate subject '{subject}' is reserved"):
        CertificateAuthenticator().authenticate(Credentials(None, certificate_subject=subject))
    assert CertificateAuthenticator().authenticate(Credentials(None, None, "carol")) == "carol"


def test_a_publisher_id_names_its_user() -> None:
    auth = Authentication([], anonymous=True)
    assert auth.authenticate(Credentials(None)).publisher_id("p") == "p"
    users = Authentication.from_config(Config().authentication)
    # the default: nobody (a peer gateway needs a PeerSecret, and there is none)
    assert [a.method for a in users.authenticators] == ["peer"] and not users.anonymous
    with pytest.raises(LogonFailed):
        users.authenticate(Credentials("_peer", "anything at all, long"))


def _entitlements(section: dict) -> Entitlements:
    return Entitlements(Config.model_validate({"Entitlements": section}).entitlements)


def test_entitlements_add_up_over_roles_regexes_and_filters() -> None:
    entitlements = _entitlements(
        {
            "Roles": {
                "fx": {"Read": [{"Topic": "orders", "Filter": "/desk = 'fx'"}]},
                "eq": {"Read": [{"Topic": "orders", "Filter": "/desk = 'eq'"}]},
                "prices": {"Read": [r"prices\..*"], "Write": [r"prices\..*"]},
            },
            "Users": {
                "alice": {"Roles": ["fx", "eq", "prices"]},
                "bob": {"Roles": ["fx"], "Read": ["orders"]},
            },
            "Default": {"Read": ["public"]},
        }
    )
    alice = entitlements.for_user("alice")
    read = alice.check_read("sow", "orders")
    assert read.filter.matches({"desk": "eq"}) and read.filter.matches({"desk": "fx"})
    assert not read.filter.matches({"desk": "rates"})
    assert alice.check_read("subscribe", "prices.eur").filter is None
    alice.check_write("publish", "prices.eur")
    with pytest.raises(Denied, match="user 'alice' may not publish to 'prices'"):
        alice.check_write("publish", "prices")  # the regex covers whole names only
    with pytest.raises(Denied, match="may not sow 'public'"):
        alice.check_read("sow", "public")  # a user with an entry does not get Default
    assert entitlements.for_user("bob").check_read("sow", "orders").filter is None  # wider
    stranger = entitlements.for_user("stranger")
    assert stranger.check_read("sow", "public").filter is None
    with pytest.raises(Denied):
        stranger.check_read("sow", "orders")
    assert Entitlements(None).for_user("anyone").unrestricted


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {
                "Gateway": {
                    "TLS": {"Certificate": "c", "Key": "k", "RequireClientCertificate": True}
                }
            },
            "RequireClientCertificate needs CA",
        ),
        ({"Entitlements": {"Users": {"a": {"Roles": ["nope"]}}}}, "unknown role"),
        ({"Entitlements": {"Users": {"a": {"Read": ["(?=x)"]}}}}, "neither a topic name"),
        (
            {"Entitlements": {"Users": {"a": {"Read": [{"Topic": "t", "Filter": "/a = = 1"}]}}}},
            "position",
        ),
        ({"Entitlements": {"Roles": {"r": {"Roles": ["r"]}}}}, "can't have Roles"),
        ({"Authentication": {"Anonymus": True}}, "Anonymus"),
        (
            {
                "Gateway": {"TLS": {"Certificate": "c", "Key": "k"}},
                "Authentication": {"ClientCertificate": True},
            },
            "ClientCertificate needs Gateway.TLS with a CA",
        ),
    ],
)
def test_bad_security_config_is_refused_naming_the_key(section: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Config.model_validate(section)


def test_security_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    from amps_on_kafka.config.loader import load_config

    path = tmp_path / "conf" / "worker.yaml"
    path.parent.mkdir()
    path.write_text(
        "Gateway:\n  TLS: {Certificate: c.pem, Key: k.pem, CA: /etc/ca.pem}\n"
        "Authentication: {UsersFile: users.txt}\n"
    )
    config = load_config(path)
    assert config.gateway.tls.certificate == path.parent / "c.pem"
    assert config.gateway.tls.ca == Path("/etc/ca.pem")
    assert config.authentication.users_file == path.parent / "users.txt"
    assert config.gateway.listen.startswith("127.0.0.1:")  # the default binds locally


def test_missing_or_damaged_security_files_are_found_before_the_worker_waits(
    tmp_path: Path,
) -> None:
    """`config check` names each, and the worker stops on them in its first second (the
    gateway, which meets them, starts only after recovery; a missing users file would
    only refuse every password)."""
    config = tmp_path / "worker.yaml"
    config.write_text(
        "Topics: [{Name: t}]\nSOW: [{Topic: t, Key: /id}]\n"
        "Gateway: {TLS: {Certificate: gw.pem, Key: gw.key}}\n"
        "Authentication: {UsersFile: users.txt}\n"
    )
    runner = CliRunner()
    checked = runner.invoke(main, ["config", "check", str(config)])
    assert checked.exit_code == 1
    assert f"Gateway.TLS: can't load certificate {tmp_path / 'gw.pem'}" in checked.output
    assert f"Authentication.UsersFile: {tmp_path / 'users.txt'} does not exist" in checked.output
    started = runner.invoke(main, ["worker", "--config", str(config), "-b", "127.0.0.1:1"])
    assert started.exit_code == 1 and "users.txt does not exist" in started.output
    (tmp_path / "users.txt").write_text("alice\n")
    checked = runner.invoke(main, ["config", "check", str(config)])
    assert "users.txt, line 1: not `name:argon2-hash`" in checked.output


def test_a_config_nobody_may_log_on_with_is_pointed_out(tmp_path: Path, caplog) -> None:
    """No Authentication is the secure default, and a surprise to whoever forgot it:
    config check notes it, and the worker warns once its gateway serves. A start that
    fails (here: no broker) says its one error line and no warning."""
    config = tmp_path / "worker.yaml"
    config.write_text("Topics: [{Name: t}]\nSOW: [{Topic: t, Key: /id}]\n")
    runner = CliRunner()
    checked = runner.invoke(main, ["config", "check", str(config)])
    assert checked.exit_code == 0 and "note: no user can log on" in checked.output
    with caplog.at_level(logging.WARNING):  # before the CLI's own logging set-up
        _warn_about_logons(load_config(config), "127.0.0.1:9007")
    assert [r.getMessage() for r in caplog.records] == [no_logon_note(load_config(config))]
    failed = runner.invoke(main, ["worker", "--config", str(config), "-b", "127.0.0.1:1"])
    assert failed.exit_code == 1 and "no user can log on" not in failed.output
    config.write_text(config.read_text() + "Authentication: {Anonymous: true}\n")
    assert "no user can log on" not in runner.invoke(main, ["config", "check", str(config)]).output


def test_a_worker_taking_passwords_in_clear_from_the_network_warns(tmp_path: Path, caplog) -> None:
    """A UsersFile, no TLS, a listen address beyond loopback: passwords cross the network
    in clear. The worker warns once it serves; on 127.0.0.1 it doesn't."""
    UsersFile(tmp_path / "users.txt").add("alice", "pw")
    config = tmp_path / "worker.yaml"
    config.write_text(
        "Topics: [{Name: t}]\nSOW: [{Topic: t, Key: /id}]\nAuthentication: {UsersFile: users.txt}\n"
    )
    with caplog.at_level(logging.WARNING):
        _warn_about_logons(load_config(config), "0.0.0.0:9007")
        wide = [r.getMessage() for r in caplog.records]
        caplog.clear()
        _warn_about_logons(load_config(config), "127.0.0.1:9007")
    assert len(wide) == 1 and "passwords cross the network in clear" in wide[0]
    assert caplog.records == []


def test_users_cli_takes_passwords_from_stdin_never_from_argv(tmp_path: Path) -> None:
    path = str(tmp_path / "users.txt")
    runner = CliRunner()
    added = runner.invoke(
        main, ["users", "add", "alice", "--file", path, "--password-stdin"], input="s3cret\n"
    )
    assert added.exit_code == 0, added.output
    assert UsersFile(Path(path)).verify("alice", "s3cret")
    prompted = runner.invoke(main, ["users", "add", "bob", "--file", path], input="pw\npw\n")
    assert prompted.exit_code == 0 and UsersFile(Path(path)).verify("bob", "pw")
    listed = runner.invoke(main, ["users", "list", "--file", path])
    assert listed.output.split() == ["alice", "bob"]
    mistyped = runner.invoke(main, ["users", "list", "--file", f"{path}.typo"])
    assert mistyped.exit_code == 1 and "users.txt.typo does not exist" in mistyped.output
    assert runner.invoke(main, ["users", "add", "c", "--file", path, "--password", "x"]).exit_code
    removed = runner.invoke(main, ["users", "remove", "alice", "--file", path])
    assert removed.exit_code == 0
    missing = runner.invoke(main, ["users", "remove", "alice", "--file", path])
    assert missing.exit_code == 1 and "no user 'alice'" in missing.output


def test_tcps_uris_carry_tls_files_and_credentials() -> None:
    endpoint = parse_uri("tcps://al%40ce:p%3Aw@gw.example:9007/amps/json?ca=/c.pem&cert=a&key=b")
    assert (endpoint.address, endpoint.user) == ("gw.example:9007", "al@ce")
    assert endpoint.password == "p:w"
    assert (endpoint.tls.ca, endpoint.tls.cert, endpoint.tls.key) == ("/c.pem", "a", "b")
    assert "p:w" not in repr(endpoint)
    assert shown(" tcps://al:pw@h:1/amps/json ") == "tcps://al:***@h:1/amps/json"  # ping's
    assert parse_uri("tcp://h:1/amps/json").tls is None
    for bad in ("tcp://h:1/amps/json?ca=x", "tcps://h:1/amps/json?nope=1", "tcps://h:1/?key=k"):
        with pytest.raises(TransportError):
            parse_uri(bad)


@given(st.text(alphabet=st.characters(blacklist_characters="@/?#%:[]", codec="ascii"), min_size=3))
def test_no_uri_error_shows_the_password(password: str) -> None:
    for uri in (
        f"tcps://u:{password}@h/amps/json",
        f"tcps://u:{password}@h:1/bad",
        f"tcps://u:{password}@h:1/amps/json?x=1",
        f"tcp://u:{password}@h:1/amps/j,",
    ):
        try:
            parse_uri(uri)
        except TransportError as exc:
            assert password not in str(exc)
