"""Secured Kafka: one function builds the client settings and every Kafka client of streamrec gets them.

The embedded broker (tansu 0.6.0) offers no secured listener a client can use (its ``--cert`` and
``--key`` cannot be given together, and with ``--authentication`` no SCRAM user can be created), so
the clients are checked here by what they are handed: each constructor is replaced by a recorder.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from unittest import mock

import pytest

from streamrec.foundation import ConfigError
from streamrec.app.config import load_config
from streamrec.ingest import KafkaSecurityError, client_settings, redacted
from streamrec.ingest.kafka_clients import PASSWORD_ENV

from tests.helpers.source import SOURCE_TREES, nodes

SECRET = "s3cr3t-Pa55"


@pytest.fixture
def pem(tmp_path):
    """A throwaway self-signed certificate (used as CA bundle and client certificate) and its key, made by the
    openssl CLI: every test using this fixture is marked ``subprocess`` (tests/conftest.py, CHILD_FIXTURES)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not found (needed to make a self-signed test certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return {"ca": str(cert), "cert": str(cert), "key": str(key)}


def _secured(pem, **extra):
    return load_config(overrides={
        "kafka.bootstrap": "kafka-1:9093", "kafka.security_protocol": "SASL_SSL",
        "kafka.sasl_mechanism": "SCRAM-SHA-512", "kafka.sasl_username": "trainer",
        "kafka.ssl_cafile": pem["ca"], **extra}, env={})


EXPECTED = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "trainer",
            "sasl_plain_password": SECRET}


def test_plaintext_adds_nothing():
    assert client_settings(load_config(env={}).kafka) == {}


def test_sasl_ssl_settings_from_env_password(pem):
    s = client_settings(_secured(pem).kafka, env={PASSWORD_ENV: SECRET})
    assert s == {**EXPECTED, "ssl_cafile": pem["ca"], "ssl_check_hostname": True}
    assert redacted(s)["sasl_plain_password"] == "***" and SECRET not in repr(redacted(s))


def test_password_file_wins_and_is_stripped_of_its_newline(pem, tmp_path):
    f = tmp_path / "pw"
    f.write_text("from-file\n")
    s = client_settings(_secured(pem, **{"kafka.sasl_password_file": str(f)}).kafka, env={PASSWORD_ENV: SECRET})
    assert s["sasl_plain_password"] == "from-file"


def test_mutual_tls_settings(pem):
    cfg = load_config(overrides={"kafka.bootstrap": "k:9093", "kafka.security_protocol": "SSL",
                                 "kafka.ssl_cafile": pem["ca"], "kafka.ssl_certfile": pem["cert"],
                                 "kafka.ssl_keyfile": pem["key"], "kafka.ssl_check_hostname": "false"}, env={})
    assert client_settings(cfg.kafka) == {"security_protocol": "SSL", "ssl_cafile": pem["ca"], "ssl_certfile": pem["cert"],
                                    "ssl_keyfile": pem["key"], "ssl_check_hostname": False}


def test_missing_password_names_both_places(pem):
    with pytest.raises(KafkaSecurityError, match=f"{PASSWORD_ENV}.*sasl_password_file"):
        client_settings(_secured(pem).kafka, env={})


def test_unusable_pem_is_named(pem, tmp_path):
    from streamrec.ingest import faust_credentials

    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    s = client_settings(_secured(pem, **{"kafka.ssl_cafile": str(bad)}).kafka, env={PASSWORD_ENV: SECRET})
    with pytest.raises(KafkaSecurityError, match="bad.pem") as e:
        faust_credentials(s)
    assert SECRET not in str(e.value)


def test_missing_ca_file_is_named(pem, tmp_path):
    cfg = _secured(pem, **{"kafka.ssl_cafile": str(tmp_path / "nope.pem")})
    with pytest.raises(KafkaSecurityError, match="kafka.ssl_cafile: .*nope.pem"):
        client_settings(cfg.kafka, env={PASSWORD_ENV: SECRET})


@pytest.mark.parametrize("overrides, match", [
    ({"kafka.security_protocol": "SASL"}, "kafka.security_protocol: must be one of"),
    ({"kafka.security_protocol": "SASL_PLAINTEXT", "kafka.sasl_mechanism": "GSSAPI"}, "kafka.sasl_mechanism"),
    ({"kafka.security_protocol": "SASL_PLAINTEXT"}, "kafka.sasl_username: .*needs a SASL user name"),
    ({"kafka.ssl_certfile": "c.pem"}, "ssl_certfile and ssl_keyfile"),
    ({"kafka.sasl_password": SECRET}, "not a config key.*STREAMREC_KAFKA_SASL_PASSWORD"),
])
def test_bad_security_config_is_refused(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(overrides=overrides, env={})
    assert SECRET not in str(e.value)


@pytest.mark.subprocess  # `python -m streamrec config`
def test_password_never_in_printed_config(tmp_path):
    """`streamrec config` shows the settings, never the password (it is not part of the config at all)."""
    env = {"PATH": "/usr/bin:/bin", PASSWORD_ENV: SECRET, "STREAMREC_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "STREAMREC_KAFKA__SASL_USERNAME": "trainer"}
    r = subprocess.run([sys.executable, "-m", "streamrec", "config"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert 'security_protocol = "SASL_PLAINTEXT"' in r.stdout and 'sasl_username = "trainer"' in r.stdout
    assert SECRET not in r.stdout + r.stderr
    env["STREAMREC_KAFKA__SASL_PASSWORD"] = SECRET  # the config route is refused, and the value not echoed
    r = subprocess.run([sys.executable, "-m", "streamrec", "config"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 2 and "STREAMREC_KAFKA__SASL_PASSWORD" in r.stderr and SECRET not in r.stderr


def test_secured_config_refuses_the_embedded_broker():
    from streamrec.app.cli import kafka_bootstrap

    cfg = load_config(overrides={"kafka.security_protocol": "SSL"}, env={})
    with pytest.raises(ConfigError, match="needs kafka.bootstrap.*PLAINTEXT only"):
        with kafka_bootstrap(cfg):
            pass


# -- every client gets the settings ----------------------------------------------------------------------


class _Stop(Exception):
    """Raised by a recording constructor to end a code path right after its client was built."""


class Recorder:
    """Stands in for KafkaConsumer/KafkaProducer/KafkaAdminClient: notes each construction's kwargs."""

    def __init__(self):
        self.built: list[tuple[str, dict]] = []
        self.stop_at: set[str] = set()

    def make(self, kind):
        def construct(*args, **kwargs):
            self.built.append((kind, kwargs))
            if kind in self.stop_at:
                raise _Stop(kind)
            fake = mock.MagicMock(name=kind)
            fake.list_topics.return_value = ["events", "events.dlq", "hot-set"]
            fake.partitions_for_topic.side_effect = lambda t: {0, 1} if t.endswith("changelog") else {0}
            return fake
        return construct

    def assert_all_secured(self, expect_kinds):
        assert sorted({k for k, _ in self.built}) == sorted(expect_kinds), self.built
        for kind, kwargs in self.built:
            for key, value in EXPECTED.items():
                assert kwargs.get(key) == value, (kind, key, redacted(kwargs))


@pytest.fixture
def rec(monkeypatch, pem):
    r = Recorder()
    import kafka
    import kafka.admin

    import streamrec.ingest.kafka_io as kio

    for mod in (kafka, kio):
        monkeypatch.setattr(mod, "KafkaConsumer", r.make("consumer"), raising=False)
        monkeypatch.setattr(mod, "KafkaProducer", r.make("producer"), raising=False)
    monkeypatch.setattr(kafka, "KafkaAdminClient", r.make("admin"))
    monkeypatch.setattr(kafka.admin, "KafkaAdminClient", r.make("admin"))
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    return r


def test_event_producer_and_consumer_with_its_dead_letter_producer(rec, pem):
    from streamrec.ingest import EventConsumer, EventProducer, EventSchema

    cfg = _secured(pem)
    EventProducer(cfg.kafka.bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    EventConsumer(cfg.kafka.bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest), group_id="g")
    assert [k for k, _ in rec.built] == ["producer", "consumer", "producer"]
    rec.assert_all_secured({"producer", "consumer"})


def test_cli_broker_check_and_topic_creation(rec, pem):
    from streamrec.app.cli import kafka_bootstrap

    cfg = _secured(pem)
    with kafka_bootstrap(cfg) as bootstrap:
        assert bootstrap == "kafka-1:9093"
    assert len(rec.built) == 2  # wait_for_broker's and ensure_topics' admin clients
    rec.assert_all_secured({"admin"})


def test_trainer_hot_set_follower_and_group_partition_check(rec, pem):
    from streamrec.foundation import hot_budget
    from streamrec.trainer.group import check_partitions
    from streamrec.trainer.hotset import make_hot_source

    cfg = _secured(pem)
    rec.stop_at = {"consumer"}
    with pytest.raises(_Stop):
        make_hot_source(cfg.trainer, cfg.model, cfg.kafka, hot_budget(cfg.hot, cfg.model), cfg.kafka.bootstrap)
    with pytest.raises(_Stop):
        check_partitions(cfg.kafka.bootstrap, "events", 1, security=client_settings(cfg.kafka))
    rec.assert_all_secured({"consumer"})


def test_sketch_worker_clients_and_faust_app(rec, pem, tmp_path):
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from streamrec.sketch.app import check_state, faust_settings
    from streamrec.sketch.follower import latest_hotset
    from streamrec.sketch.peers import PeerSnapshots
    from tests.helpers.sketch import sketch_cluster

    cfg = _secured(pem, **{"sketch.state_dir": str(tmp_path / "sketch")})
    # the changelog's 2 partitions != the events' 1: the admin deletes it
    check_state(cfg.kafka, cfg.sketch.state_dir, sketch_cluster(cfg))
    rec.stop_at = {"consumer"}
    with pytest.raises(_Stop):
        latest_hotset(cfg.kafka.bootstrap, "hot-set", security=client_settings(cfg.kafka))
    with pytest.raises(_Stop):
        PeerSnapshots(cfg.kafka.bootstrap, "changelog", security=client_settings(cfg.kafka))
    assert [k for k, _ in rec.built] == ["consumer", "admin", "consumer", "consumer"]
    rec.assert_all_secured({"consumer", "admin"})
    # what faust hands its aiokafka clients
    settings = faust_settings(sketch_cluster(cfg), cfg.sketch.state_dir, 1)
    auth = credentials_to_aiokafka_auth(settings["broker_credentials"])
    assert {k: auth[k] for k in EXPECTED} == EXPECTED
    assert auth["ssl_context"] is not None  # SASL_SSL: TLS under the SASL exchange


def test_faust_gets_ssl_and_plaintext(monkeypatch, pem):
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from streamrec.sketch.app import faust_settings
    from tests.helpers.sketch import sketch_cluster

    assert faust_settings(sketch_cluster(load_config(env={}), "k:9092"), "state", 1)["broker_credentials"] is None
    cfg = load_config(overrides={"kafka.bootstrap": "k:9093", "kafka.security_protocol": "SSL"}, env={})
    auth = credentials_to_aiokafka_auth(faust_settings(sketch_cluster(cfg, "k:9093"), "state", 1)["broker_credentials"])
    assert auth["security_protocol"] == "SSL" and auth["ssl_context"].check_hostname


@SOURCE_TREES
def test_no_client_is_built_outside_the_settings():
    """Every construction of a kafka-python client in the package passes the security settings on."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    bare = []
    for d in ("ingest", "sketch", "trainer", "serving", "embedding_store", "streamrec", "benchmarks"):
        for path in (root / d).rglob("*.py"):
            for node in nodes(path):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in ("KafkaConsumer", "KafkaProducer", "KafkaAdminClient")
                        and not any(kw.arg is None for kw in node.keywords)):  # no **settings / **opts
                    bare.append(f"{path.relative_to(root)}:{node.lineno}")
    assert bare == []


@pytest.mark.subprocess  # `python -m streamrec produce`
def test_cli_without_the_password_is_one_line_naming_where_it_goes(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != PASSWORD_ENV}
    r = subprocess.run([sys.executable, "-m", "streamrec", "produce", "--synthetic", "10", "--bootstrap",
                        "127.0.0.1:9", "--set", "kafka.security_protocol=SASL_PLAINTEXT",
                        "--set", "kafka.sasl_username=trainer"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0
    assert PASSWORD_ENV in r.stderr and "kafka.sasl_password_file" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
