"""Static consistency of docker-compose.yml, deploy/Dockerfile and deploy/streamrec.toml with the code.

No Docker engine is needed: each streamrec service's environment and command are
loaded through the real config loader and CLI parser, so a renamed config key,
a wrong STREAMREC_* variable, a removed CLI flag or a moved health check fails here
instead of at container start-up.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from streamrec.app.cli import build_parser
from streamrec.foundation import ConfigError, load_config, parse_overrides

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()
IMAGE_CONFIG = "/etc/streamrec/streamrec.toml"


def _interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR}`` with nothing set in the environment; a required
    ``${VAR:?message}`` (compose refuses to start without it) as the stand-in ``<VAR>``."""
    value = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?\?[^}]*\}", lambda m: f"<{m.group(1)}>", str(value))
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def _streamrec_services() -> dict[str, dict]:
    return {name: s for name, s in COMPOSE["services"].items() if s.get("image", "").startswith("streamrec")}


def _streamrec_argv(service: dict) -> list[str]:
    """The streamrec command line of a service; a torchrun service's is what follows ``--module streamrec``
    (and torchrun's own arguments must parse with torchrun's parser)."""
    argv = list(service["command"])
    if service.get("entrypoint") == ["torchrun"]:
        from torch.distributed.run import get_args_parser

        launch = get_args_parser().parse_args(argv)
        assert launch.module and launch.training_script == "streamrec", argv
        return list(launch.training_script_args)
    assert "entrypoint" not in service, service["entrypoint"]
    return argv


def _load(service: dict):
    """The Config a service's container would run with (image config + its env + its --set)."""
    env = {k: _interpolate(v) for k, v in (service.get("environment") or {}).items()}
    argv = _streamrec_argv(service)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    cfg = load_config(ROOT / "deploy" / "streamrec.toml", parse_overrides(sets), env=env)
    return cfg, env, argv


def test_every_streamrec_service_config_loads_and_its_command_parses():
    services = _streamrec_services()
    assert {"serving", "sketch", "trainer", "producer"} <= set(services)
    # the config the commands name is the one the image ships
    assert f"COPY deploy/streamrec.toml {IMAGE_CONFIG}" in DOCKERFILE
    assert re.search(r'^ENTRYPOINT \["streamrec"\]', DOCKERFILE, re.M)
    parser = build_parser()
    for name, s in services.items():
        cfg, env, argv = _load(s)  # a misspelled STREAMREC_* or --set key raises ConfigError here
        assert all(k.startswith("STREAMREC_") and "__" in k for k in env if k != "GLOO_SOCKET_IFNAME"), \
            f"{name}: {sorted(env)}"
        assert argv[argv.index("--config") + 1] == IMAGE_CONFIG, name
        args = parser.parse_args(argv)  # an unknown subcommand or flag exits (SystemExit) here
        assert callable(args.func), name
        assert cfg.kafka.bootstrap == "kafka:9092", name
        if name == "producer":
            continue  # writes nothing to disk
        # every path a service writes is under the /data volume it mounts
        mounts = {v.split(":")[1] for v in s.get("volumes", [])}
        assert "/data" in mounts, f"{name} mounts no /data volume: {mounts}"
        for path in (cfg.store.path, cfg.sketch.state_dir, cfg.trainer.checkpoint_dir, cfg.trainer.snapshot_dir,
                     cfg.trainer.log_path, cfg.serving.data_dir):
            assert path.startswith("/data/"), f"{name}: {path} is not on the /data volume"


def test_services_agree_on_ports_tokens_and_the_health_check():
    services = _streamrec_services()
    serving, _, _ = _load(services["serving"])
    trainer, _, _ = _load(services["trainer"])
    # serving binds all interfaces on the port compose publishes; the trainer pushes there with the same token
    assert serving.serving.host == "0.0.0.0"
    assert f"{serving.serving.port}:{serving.serving.port}" in services["serving"]["ports"]
    assert trainer.push_targets() == [f"serving:{serving.serving.port}"]
    assert trainer.serving.push_token == serving.serving.push_token != ""
    # no default secret: compose refuses to start without STREAMREC_PUSH_TOKEN; and serving would refuse an
    # empty one on 0.0.0.0 (without --insecure-push, which the stack never passes)
    assert serving.serving.push_token == "<STREAMREC_PUSH_TOKEN>"
    from streamrec.serving.server import push_exposure

    assert push_exposure(serving) is None and "--insecure-push" not in services["serving"]["command"]
    serving.serving.push_token = ""
    assert push_exposure(serving) is not None
    assert trainer.trainer.metrics_port and f"{trainer.trainer.metrics_port}:{trainer.trainer.metrics_port}" in [
        str(p).split("#")[0].strip() for p in services["trainer"]["ports"]]
    assert trainer.trainer.metrics_host == "0.0.0.0"  # the published port must be reachable from outside the container
    # the health check runs a module that exists, with a check() over the port serving listens on
    test = services["serving"]["healthcheck"]["test"]
    assert test[:4] == ["CMD", "python", "-m", "streamrec.app.healthcheck"]
    assert test[4] == f"127.0.0.1:{serving.serving.port}"
    from streamrec.app import healthcheck

    assert callable(healthcheck.check)
    assert healthcheck.check(f"127.0.0.1:{_free_port()}", timeout=0.5) is False  # nothing listens: not healthy


def test_a_misspelled_variable_in_compose_would_be_refused():
    """The check above can fail: the loader refuses an unknown STREAMREC_* key instead of ignoring it."""
    s = dict(_streamrec_services()["trainer"])
    s["environment"] = {**s["environment"], "STREAMREC_SERVING__PUSHTOKEN": "x"}
    with pytest.raises(ConfigError, match="STREAMREC_SERVING__PUSHTOKEN"):
        _load(s)
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split("train --config x --no-such-flag"))


def _free_port() -> int:
    import socket

    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]
