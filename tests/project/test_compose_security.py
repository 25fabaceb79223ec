"""The compose stack lets no one in by default, checked without a Docker engine.

- docker-compose.yml, alone and with deploy/compose.secure.yml merged onto it (compose's merge rules), validates
  against the Compose Specification's JSON schema (schemas/compose-spec.json, the compose-spec project's file)
  with jsonschema, after interpolation as ``docker compose`` does it.
- Every published port names its host address: 127.0.0.1 with nothing set, the operator's address with
  STREAMREC_PUBLISH_ADDR (STREAMREC_MONITORING_ADDR for Prometheus and Grafana). compose-lint, a third-party
  compose linter, finds no unbound port.
- The secure override: every streamrec service's Kafka client reaches the broker's SASL_SSL listener with the
  mounted CA and password; nothing that leaves the broker container is PLAINTEXT; serving speaks TLS and
  Predict and PushSnapshot need tokens that compose refuses to start without.
- deploy/gen-secrets.sh (openssl) makes certificates a TLS client accepts under the names the stack uses:
  the serving health check of the override passes against a real gRPC TLS server with them, and the broker's
  PEM keystore completes a TLS handshake as ``kafka`` and ``localhost``.
"""

from __future__ import annotations

import copy
import io
import json
import re
import shutil
import socket
import ssl
import subprocess
import threading
from contextlib import redirect_stdout
from pathlib import Path

import jsonschema
import pytest
import yaml

from streamrec.app.config import load_config

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "docker-compose.yml"
SECURE = ROOT / "deploy" / "compose.secure.yml"
SCHEMA = json.loads((Path(__file__).parent / "schemas" / "compose-spec.json").read_text())
# what compose needs set to interpolate the files at all (the ``${VAR:?message}`` secrets)
TOKENS = {"STREAMREC_PUSH_TOKEN": "push-secret", "STREAMREC_PREDICT_TOKEN": "predict-secret"}
STREAMREC_SERVICES = {"serving", "sketch", "join", "trainer", "trainer-gpu", "trainer-0", "trainer-1", "producer"}


class MissingVariable(Exception):
    pass


_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _interpolate(node, env: dict[str, str]):
    """Compose's interpolation of every string value: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?message}`` / ``${VAR?message}`` (unset, or empty with ``:``, stops compose:
    :class:`MissingVariable`), ``${VAR:+alternative}`` / ``${VAR+alternative}``."""
    if isinstance(node, dict):
        return {k: _interpolate(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, env) for v in node]
    if not isinstance(node, str):
        return node

    def one(m: re.Match) -> str:
        if m.group(1):
            return "$"
        name, op, arg = m.group(2) or m.group(5), m.group(3), m.group(4) or ""
        value = env.get(name)
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op in (":-", "-"):
            return arg if unset else value
        if op in (":?", "?"):
            if unset:
                raise MissingVariable(f"{name}: {arg}")
            return value
        if op in (":+", "+"):
            return "" if unset else arg
        return value or ""

    return _VAR.sub(one, node)


def _merge(base, over, key: str = ""):
    """``over`` merged onto ``base`` as compose merges files: mappings key by key; ``command``, ``entrypoint``
    and a health check's ``test`` replaced; ``ports``, ``secrets`` and ``volumes`` appended (a volume replaced
    by one with the same target); other sequences replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(over, list) and key in ("ports", "secrets", "volumes"):
        if key == "volumes":
            targets = {str(v).split(":")[1] for v in over}
            return [v for v in base if str(v).split(":")[1] not in targets] + list(over)
        return list(base) + [v for v in over if v not in base]
    return copy.deepcopy(over)


def _raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _model(env: dict[str, str] | None = None, secure: bool = False) -> dict:
    """The stack ``docker compose [-f docker-compose.yml -f deploy/compose.secure.yml] config`` would run."""
    doc = _raw(BASE)
    if secure:
        doc = _merge(doc, _raw(SECURE))
    return _interpolate(doc, {**TOKENS, **(env or {})})


def _host_ips(service: dict) -> list[str | None]:
    """The host address of each published port of a service (None: published on every interface)."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):  # long syntax
            out.append(p.get("host_ip") if "published" in p else None)
            continue
        m = re.fullmatch(r"(?:(\[[0-9a-fA-F:]+\]|[^:\[\]]+):)?(?:(\d+(?:-\d+)?):)?(\d+(?:-\d+)?)(?:/\w+)?", str(p))
        assert m, f"not a port entry: {p!r}"
        out.append(m.group(1) if m.group(2) else None)  # "8080" alone is published on a random host port, everywhere
    return out


# -- the compose-spec schema ------------------------------------------------------------------------------------

def _validate(doc: dict) -> list[str]:
    cls = jsonschema.validators.validator_for(SCHEMA)
    cls.check_schema(SCHEMA)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in cls(SCHEMA).iter_errors(doc)]


@pytest.mark.parametrize("secure", [False, True], ids=["base", "base+secure"])
def test_the_stack_validates_against_the_compose_spec_schema(secure):
    assert _validate(_model(secure=secure)) == []
    # and with an operator's addresses set
    assert _validate(_model({"STREAMREC_PUBLISH_ADDR": "192.0.2.7", "STREAMREC_MONITORING_ADDR": "::1"}, secure)) == []


def test_the_schema_check_can_fail():
    doc = _model()
    doc["services"]["serving"]["restart_policy"] = "always"  # not a service key
    doc["services"]["kafka"]["ports"] = [["29092", "29092"]]  # neither a string, a number nor a mapping
    doc["services"]["trainer"]["depends_on"]["kafka"]["condition"] = "service_ready"
    errors = "\n".join(_validate(doc))
    assert "restart_policy" in errors and "services/kafka/ports/0" in errors and "service_ready" in errors


# -- published ports --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("secure", [False, True], ids=["base", "base+secure"])
def test_no_port_is_published_on_all_interfaces_by_default(secure):
    published = {name: _host_ips(s) for name, s in _model(secure=secure)["services"].items() if s.get("ports")}
    assert {"kafka", "serving", "trainer", "prometheus", "grafana"} <= set(published)
    for name, ips in published.items():
        assert ips and all(ip == "127.0.0.1" for ip in ips), f"{name} publishes on {ips}"
    for name, s in _model(secure=secure)["services"].items():  # host networking would bypass `ports:`
        assert s.get("network_mode") != "host", name


def test_publish_addresses_are_the_operators_to_set():
    model = _model({"STREAMREC_PUBLISH_ADDR": "192.0.2.7"})
    ips = {name: set(_host_ips(s)) for name, s in model["services"].items() if s.get("ports")}
    assert ips["kafka"] == ips["serving"] == ips["trainer"] == {"192.0.2.7"}
    assert ips["prometheus"] == ips["grafana"] == {"127.0.0.1"}  # no login: published only when asked for apart
    model = _model({"STREAMREC_MONITORING_ADDR": "0.0.0.0"})
    assert set(_host_ips(model["services"]["grafana"])) == {"0.0.0.0"}
    assert set(_host_ips(model["services"]["kafka"])) == {"127.0.0.1"}
    # an empty value is "not set" (`:-`), never an empty host address, which docker reads as every interface
    assert set(_host_ips(_model({"STREAMREC_PUBLISH_ADDR": ""})["services"]["serving"])) == {"127.0.0.1"}
    # the broker advertises the host clients use to reach the EXTERNAL listener
    env = _model({"STREAMREC_KAFKA_EXTERNAL_HOST": "kafka.example.com"})["services"]["kafka"]["environment"]
    assert "EXTERNAL://kafka.example.com:29092" in env["KAFKA_ADVERTISED_LISTENERS"]


def test_the_port_check_can_fail():
    assert _host_ips({"ports": ["29092:29092", "50051", "0.0.0.0:9100:9100", {"target": 1, "published": 2}]}) == \
        [None, None, "0.0.0.0", None]
    assert _host_ips({"ports": ["[::1]:80:80/tcp", {"target": 1, "published": 2, "host_ip": "127.0.0.1"}]}) == \
        ["[::1]", "127.0.0.1"]


def _compose_lint(path: Path) -> list[dict]:
    """compose-lint's findings for one file (its JSON report; the linter exits with its verdict)."""
    from compose_lint.cli import main

    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        main(["check", "--no-env", "--format", "json", str(path)])
    return json.loads(out.getvalue())["findings"]


UNBOUND_PORT = "CL-0005"  # compose-lint: a port published without a host address


def test_a_third_party_linter_finds_no_unbound_port(tmp_path):
    assert [f for f in _compose_lint(BASE) if f["rule_id"] == UNBOUND_PORT] == []
    merged = tmp_path / "docker-compose.yml"
    merged.write_text(yaml.safe_dump(_merge(_raw(BASE), _raw(SECURE)), sort_keys=False))
    assert [f for f in _compose_lint(merged) if f["rule_id"] == UNBOUND_PORT] == []
    # the linter sees a port without its host address, in either syntax
    for unbound in ("50051:50051", {"target": 50051, "published": "50051"}):
        doc = _raw(BASE)
        doc["services"]["serving"]["ports"] = [unbound]
        merged.write_text(yaml.safe_dump(doc, sort_keys=False))
        assert [f["service"] for f in _compose_lint(merged) if f["rule_id"] == UNBOUND_PORT] == ["serving"]


# -- the secure override ----------------------------------------------------------------------------------------

def _listeners(value: str) -> dict[str, tuple[str, int]]:
    out = {}
    for part in value.split(","):
        name, _, rest = part.partition("://")
        host, _, port = rest.rpartition(":")
        out[name] = (host, int(port))
    return out


def test_secure_kafka_listens_only_with_sasl_ssl_beyond_its_loopback():
    kafka = _model(secure=True)["services"]["kafka"]
    env = kafka["environment"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = _listeners(env["KAFKA_LISTENERS"])
    assert set(listeners) == set(protocols)
    for name, (host, _) in listeners.items():  # PLAINTEXT only where no other container can connect
        assert protocols[name] == "SASL_SSL" or host in ("localhost", "127.0.0.1"), (name, host, protocols[name])
    assert protocols["INTERNAL"] == protocols["EXTERNAL"] == "SASL_SSL"
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    assert advertised["INTERNAL"] == ("kafka", 9092) and advertised["EXTERNAL"] == ("localhost", 29092)
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "BROKER" and protocols["BROKER"] == "PLAINTEXT"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split("@")[1] == "localhost:%d" % listeners["CONTROLLER"][1]
    # the image demands JKS files when an advertised listener is named *SSL or SASL_*: these are not
    assert "SSL://" not in env["KAFKA_ADVERTISED_LISTENERS"] and "SASL_" not in env["KAFKA_ADVERTISED_LISTENERS"]
    # the image renders KAFKA_* variables to properties and drops a value holding "=": none here but KAFKA_OPTS
    assert [k for k, v in env.items() if "=" in str(v) and k != "KAFKA_OPTS"] == []
    assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == "PLAIN" and env["KAFKA_SSL_KEYSTORE_TYPE"] == "PEM"
    mounted = {f"/run/secrets/{s}" for s in kafka["secrets"]}
    assert env["KAFKA_SSL_KEYSTORE_LOCATION"] in mounted
    assert env["KAFKA_OPTS"] == "-Djava.security.auth.login.config=/run/secrets/kafka_jaas"
    assert "/run/secrets/kafka_jaas" in mounted
    # the health check uses the loopback listener, and the published port is the SASL_SSL one
    assert f"localhost:{listeners['BROKER'][1]}" in kafka["healthcheck"]["test"][1]
    assert [(int(p["published"]), p["target"]) for p in kafka["ports"]] == [(listeners["EXTERNAL"][1],) * 2]


def _secrets_dir(model: dict) -> dict[str, str]:
    return {name: s["file"] for name, s in model["secrets"].items()}


def test_every_streamrec_service_reaches_kafka_over_sasl_ssl_with_mounted_secrets(tmp_path):
    model = _model(secure=True)
    kafka_env = model["services"]["kafka"]["environment"]
    internal = _listeners(kafka_env["KAFKA_ADVERTISED_LISTENERS"])["INTERNAL"]
    files = _secrets_dir(model)
    assert all(f.startswith("./deploy/secrets/") for f in files.values())  # made by deploy/gen-secrets.sh
    services = {n: s for n, s in model["services"].items() if str(s.get("image", "")).startswith("streamrec")}
    assert set(services) == STREAMREC_SERVICES
    # the real config loader and client settings, with /run/secrets/<name> standing at tmp_path/<name>
    for name in files:
        (tmp_path / name).write_text("x\n")
    from streamrec.ingest import client_settings

    for name, s in services.items():
        env = {k: str(v).replace("/run/secrets/", f"{tmp_path}/") for k, v in s["environment"].items()
               if k.startswith("STREAMREC_")}
        cfg = load_config(ROOT / "deploy" / "streamrec.toml", env=env)
        k = cfg.kafka
        assert k.bootstrap == "%s:%d" % internal, name
        assert (k.security_protocol, k.sasl_mechanism, k.sasl_username) == ("SASL_SSL", "PLAIN", "streamrec"), name
        assert k.ssl_check_hostname, name
        for path in (k.sasl_password_file, k.ssl_cafile, cfg.serving.tls_ca):
            assert Path(path).parent == tmp_path and Path(path).name in s["secrets"], (name, path)
        settings = client_settings(cfg.kafka, env={})  # the password comes from the mounted file, not the environment
        assert settings["security_protocol"] == "SASL_SSL" and settings["sasl_plain_password"] == "x", name
        assert cfg.serving.predict_token == TOKENS["STREAMREC_PREDICT_TOKEN"], name
        assert cfg.serving.push_token == TOKENS["STREAMREC_PUSH_TOKEN"], name


def test_secure_serving_needs_tokens_and_speaks_tls():
    raw = _raw(SECURE)
    token = raw["x-kafka-client"]["STREAMREC_SERVING__PREDICT_TOKEN"]
    assert re.fullmatch(r"\$\{STREAMREC_PREDICT_TOKEN:\?[^}]*STREAMREC_PREDICT_TOKEN[^}]*\}", token), token
    for var in TOKENS:  # unset or empty: compose stops with the message, no default secret anywhere
        for value in (None, ""):
            env = {**TOKENS, var: value} if value is not None else {k: v for k, v in TOKENS.items() if k != var}
            with pytest.raises(MissingVariable, match=var):
                _interpolate(_merge(_raw(BASE), raw), env)
    serving = _model(secure=True)["services"]["serving"]
    env = {k: str(v) for k, v in serving["environment"].items()}
    cfg = load_config(ROOT / "deploy" / "streamrec.toml", env=env)
    from streamrec.serving.server import startup_warnings

    assert cfg.serving.tls_cert and cfg.serving.tls_key and cfg.serving.host == "0.0.0.0"
    assert {Path(cfg.serving.tls_cert).name, Path(cfg.serving.tls_key).name} <= set(serving["secrets"])
    assert startup_warnings(cfg.serving, insecure_push=False) == []  # tokens set, and they never cross the network in clear
    test = serving["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"] and "/run/secrets/ca" in test[3] and "secure_channel" in test[3]


# -- the secrets script -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def secrets(tmp_path_factory) -> Path:
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    out = tmp_path_factory.mktemp("secrets") / "secrets"
    subprocess.run(["bash", str(ROOT / "deploy" / "gen-secrets.sh"), str(out)], check=True, capture_output=True,
                   timeout=120)
    return out


@pytest.mark.subprocess
def test_gen_secrets_makes_every_file_the_override_mounts(secrets):
    files = {Path(f).name for f in _secrets_dir(_model(secure=True)).values()}
    assert files <= {p.name for p in secrets.iterdir()}
    assert (secrets.stat().st_mode & 0o777) == 0o700 and (secrets / "ca.key").stat().st_mode & 0o077 == 0
    password = (secrets / "kafka-password").read_text().strip()
    assert len(password) >= 32 and f'user_streamrec="{password}";' in (secrets / "kafka-jaas.conf").read_text()
    keystore = (secrets / "kafka-broker.pem").read_text()
    assert keystore.startswith("-----BEGIN PRIVATE KEY-----") and "-----BEGIN CERTIFICATE-----" in keystore  # PKCS#8
    # a second run never replaces the CA the clients trust
    again = subprocess.run(["bash", str(ROOT / "deploy" / "gen-secrets.sh"), str(secrets)], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode != 0 and "exists" in again.stderr
    assert (secrets / "kafka-password").read_text().strip() == password


@pytest.mark.subprocess
@pytest.mark.parametrize("name", ["kafka", "localhost"])
def test_the_broker_keystore_completes_a_tls_handshake(secrets, name):
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(secrets / "kafka-broker.pem")  # key and certificate in one file, as Kafka reads it
    client_ctx = ssl.create_default_context(cafile=str(secrets / "ca.pem"))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve():
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                client_ctx.wrap_socket(raw, server_hostname=name) as tls:
            assert tls.recv(2) == b"ok"
        t.join(10)
    with socket.create_server(("127.0.0.1", 0)) as listener:  # and a name it does not carry is refused
        port = listener.getsockname()[1]
        t = threading.Thread(target=lambda: _accept_and_fail(listener, server_ctx), daemon=True)
        t.start()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                pytest.raises(ssl.SSLCertVerificationError):
            client_ctx.wrap_socket(raw, server_hostname="elsewhere.example")
        t.join(10)


def _accept_and_fail(listener, ctx):
    conn, _ = listener.accept()
    try:
        ctx.wrap_socket(conn, server_side=True).close()
    except (ssl.SSLError, OSError):
        conn.close()


@pytest.mark.subprocess
@pytest.mark.grpc
def test_the_secure_serving_health_check_passes_against_a_tls_server(secrets):
    import grpc
    from concurrent import futures
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    code = _model(secure=True)["services"]["serving"]["healthcheck"]["test"][3]
    server = grpc.server(futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    key, cert = (secrets / "serving.key").read_bytes(), (secrets / "serving.pem").read_bytes()
    creds = grpc.ssl_server_credentials([(key, cert)])
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    try:
        def check() -> int:
            run = code.replace("/run/secrets/ca", str(secrets / "ca.pem"))
            run = run.replace("127.0.0.1:50051", f"127.0.0.1:{port}")
            try:
                exec(compile(run, "healthcheck", "exec"), {})
            except SystemExit as e:
                return int(e.code)
            except grpc.RpcError:
                return 1  # in the container: a traceback and exit status 1
            raise AssertionError("the health check must exit")

        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert check() == 1
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert check() == 0
    finally:
        server.stop(None)
