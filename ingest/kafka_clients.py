"""How every Kafka client of streamrec reaches the cluster: the security settings.

:func:`client_settings` is the one place that turns ``[kafka]`` (protocol, SASL
mechanism and user, TLS files) plus the password into keyword arguments of
kafka-python's ``KafkaProducer``/``KafkaConsumer``/``KafkaAdminClient``; every
client the project builds gets them (``**client_settings(kafka)``), and
:func:`faust_credentials` hands the same settings to the sketch's faust app.

The password is never part of the config (a config is printed by ``streamrec
config`` and written to disk for child processes): it comes from the environment
variable ``STREAMREC_KAFKA_SASL_PASSWORD`` or the file ``kafka.sasl_password_file``
(a mounted secret) at the moment a client is built, and :func:`redacted` is what a
log line may show of the settings.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, get_args

from streamrec.foundation import StreamrecError

from .ingest_types import SaslMechanism, SecurityProtocol

if TYPE_CHECKING:
    from streamrec.ingest.ingest_config import KafkaConfig

PASSWORD_ENV = "STREAMREC_KAFKA_SASL_PASSWORD"
_SECRET_KEYS = ("sasl_plain_password",)


class KafkaSecurityError(StreamrecError, ValueError):
    """The Kafka security settings cannot be used as configured (a missing file, no password)."""


def client_settings(kafka: KafkaConfig, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """kafka-python keyword arguments for the cluster that ``kafka`` (the ``[kafka]`` section) names.

    Empty for PLAINTEXT, so a client on an open cluster gets kafka-python's own defaults."""
    k = kafka
    proto = k.security_protocol
    if proto not in get_args(SecurityProtocol):
        raise KafkaSecurityError(f"kafka.security_protocol: must be one of {', '.join(get_args(SecurityProtocol))}, "
                                 f"got {proto!r}")
    if proto == "PLAINTEXT":
        return {}
    out: dict[str, Any] = {"security_protocol": proto}
    if proto in ("SSL", "SASL_SSL"):
        out["ssl_check_hostname"] = bool(k.ssl_check_hostname)
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(k, key)
            if path:
                if not os.path.isfile(path):
                    raise KafkaSecurityError(f"kafka.{key}: {path} is not a readable file (a PEM file is expected)")
                out[key] = path
    if proto.startswith("SASL_"):
        if k.sasl_mechanism not in get_args(SaslMechanism):
            raise KafkaSecurityError(f"kafka.sasl_mechanism: must be one of {', '.join(get_args(SaslMechanism))}, "
                                     f"got {k.sasl_mechanism!r}")
        out["sasl_mechanism"] = k.sasl_mechanism
        out["sasl_plain_username"] = k.sasl_username
        out["sasl_plain_password"] = _password(k, os.environ if env is None else env)
    return out


def _password(k: KafkaConfig, env: Mapping[str, str]) -> str:
    if k.sasl_password_file:
        try:
            return Path(k.sasl_password_file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as e:
            raise KafkaSecurityError(f"kafka.sasl_password_file: cannot read {k.sasl_password_file}: "
                                     f"{e.strerror or e}") from None
    pw = env.get(PASSWORD_ENV)
    if not pw:
        raise KafkaSecurityError(f"kafka.security_protocol={k.security_protocol} needs the SASL password of user "
                                 f"{k.sasl_username!r}: set the environment variable {PASSWORD_ENV} or "
                                 "kafka.sasl_password_file")
    return pw


def redacted(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` as a log line or an error may show them: secrets replaced by ``***``."""
    return {k: ("***" if k in _SECRET_KEYS and v else v) for k, v in settings.items()}


def ssl_context(settings: Mapping[str, Any]):
    """An ``ssl.SSLContext`` with the CA, client certificate and hostname check of ``settings``."""
    import ssl

    files = [settings.get(k) for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if settings.get(k)]
    try:
        ctx = ssl.create_default_context(cafile=settings.get("ssl_cafile") or None)
        ctx.check_hostname = bool(settings.get("ssl_check_hostname", True))
        if settings.get("ssl_certfile"):
            ctx.load_cert_chain(settings["ssl_certfile"], settings["ssl_keyfile"])
    except (ssl.SSLError, OSError) as e:
        raise KafkaSecurityError(f"kafka TLS files {', '.join(files)}: not usable PEM ({e})") from None
    return ctx


def faust_credentials(settings: Mapping[str, Any]):
    """The same settings as faust's ``broker_credentials`` (None for PLAINTEXT)."""
    proto = settings.get("security_protocol", "PLAINTEXT")
    if proto == "PLAINTEXT":
        return None
    from faust.auth import SASLCredentials, SSLCredentials

    if proto == "SSL":
        return SSLCredentials(ssl_context(settings))
    # faust picks SASL_SSL when it gets an SSL context, SASL_PLAINTEXT without one
    return SASLCredentials(username=settings["sasl_plain_username"], password=settings["sasl_plain_password"],
                           mechanism=settings["sasl_mechanism"],
                           ssl_context=ssl_context(settings) if proto == "SASL_SSL" else None)


def aiokafka_security(kafka: KafkaConfig) -> dict:
    """The cluster's security settings (``kafka.security_protocol``, ...) as aiokafka keyword arguments, for
    the faust workers' own aiokafka clients (the sketch's reader, the joiner's reader and producer)."""
    settings = client_settings(kafka)
    if not settings:
        return {}
    out = {k: settings[k] for k in ("security_protocol", "sasl_mechanism", "sasl_plain_username",
                                    "sasl_plain_password") if k in settings}
    creds = faust_credentials(settings)
    ctx = getattr(creds, "context", None) or getattr(creds, "ssl_context", None)
    if ctx is not None:
        out["ssl_context"] = ctx
    return out
