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
import yaml

from streamrec.app.cli import build_parser
from streamrec.foundation import ConfigError, parse_overrides
from streamrec.app.config import load_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()
IMAGE_CONFIG = "/etc/streamrec/streamrec.toml"


def _interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR}`` with nothing set in the environment; a required
    ``${VAR:?message}`` (compose refuses to start without it) as the stand-in ``<VAR>``."""
    value = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?\?[^}]*\}", lambda m: f"<{m.group(1)}>", str(value))
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def _port(entry) -> str:
    """A ``ports:`` entry, short or long syntax, as ``[HOST_IP:]PUBLISHED:TARGET`` with nothing set in the
    environment."""
    if isinstance(entry, dict):
        host = _interpolate(str(entry.get("host_ip", "")))
        return f"{host + ':' if host else ''}{_interpolate(str(entry['published']))}:{entry['target']}"
    return _interpolate(str(entry).split("#")[0].strip())


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
    published = [_port(p) for p in services["serving"]["ports"]]  # on 127.0.0.1 unless STREAMREC_PUBLISH_ADDR
    assert f"127.0.0.1:{serving.serving.port}:{serving.serving.port}" in published
    from streamrec.serving import push_targets

    assert push_targets(trainer.serving) == [f"serving:{serving.serving.port}"]
    assert trainer.serving.push_token == serving.serving.push_token != ""
    # no default secret: compose refuses to start without STREAMREC_PUSH_TOKEN; and serving would refuse an
    # empty one on 0.0.0.0 (without --insecure-push, which the stack never passes)
    assert serving.serving.push_token == "<STREAMREC_PUSH_TOKEN>"
    from streamrec.serving.server import push_exposure

    assert push_exposure(serving.serving) is None and "--insecure-push" not in services["serving"]["command"]
    serving.serving.push_token = ""
    assert push_exposure(serving.serving) is not None
    metrics = trainer.trainer.metrics_port
    assert metrics and f"127.0.0.1:{metrics}:{metrics}" in [_port(p) for p in services["trainer"]["ports"]]
    assert trainer.trainer.metrics_host == "0.0.0.0"  # the published port must be reachable from outside the container
    # the health check runs a module that exists, with a check() over the port serving listens on
    test = services["serving"]["healthcheck"]["test"]
    assert test[:4] == ["CMD", "python", "-m", "streamrec.app.healthcheck"]
    assert test[4] == f"127.0.0.1:{serving.serving.port}"
    from streamrec.app import healthcheck
    from streamrec.ingest import free_port

    assert callable(healthcheck.check)
    assert healthcheck.check(f"127.0.0.1:{free_port()}", timeout=0.5) is False  # nothing listens: not healthy


def test_a_misspelled_variable_in_compose_would_be_refused():
    """The check above can fail: the loader refuses an unknown STREAMREC_* key instead of ignoring it."""
    s = dict(_streamrec_services()["trainer"])
    s["environment"] = {**s["environment"], "STREAMREC_SERVING__PUSHTOKEN": "x"}
    with pytest.raises(ConfigError, match="STREAMREC_SERVING__PUSHTOKEN"):
        _load(s)
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split("train --config x --no-such-flag"))


# -- the compose file itself: what `docker compose config` would refuse, checked without Docker -----------------

# compose-spec service keys this stack may use (a misspelled key is refused here, as compose refuses it)
SERVICE_KEYS = {
    "build", "image", "command", "entrypoint", "environment", "env_file", "ports", "expose", "volumes", "depends_on",
    "healthcheck", "restart", "profiles", "deploy", "hostname", "stop_grace_period", "stop_signal", "user",
    "working_dir", "labels", "logging", "networks", "ulimits", "shm_size", "init", "secrets", "configs",
}
TOP_KEYS = {"version", "name", "services", "volumes", "networks", "configs", "secrets"}
DURATION = re.compile(r"^(\d+(\.\d+)?(us|ms|s|m|h))+$")
PORT = re.compile(r"^((\d{1,3}(\.\d{1,3}){3}|\[[0-9a-fA-F:]+\]):)?(\d+(-\d+)?:)?\d+(-\d+)?(/(tcp|udp))?$")
# $$ (a literal $), ${VAR}, ${VAR-x} / ${VAR:-x}, ${VAR?msg} / ${VAR:?msg}; anything else is an interpolation error
INTERPOLATION = re.compile(r"\$\$|\$\{[A-Za-z_][A-Za-z0-9_]*(?::?[-?][^}$]*)?\}|\$[A-Za-z_][A-Za-z0-9_]*")


def _strings(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


def _seconds(duration: str) -> float:
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)(us|ms|s|m|h)", duration))


def test_compose_file_is_well_formed():
    assert set(COMPOSE) - TOP_KEYS <= {k for k in COMPOSE if k.startswith("x-")}, sorted(COMPOSE)
    services, declared = COMPOSE["services"], set(COMPOSE.get("volumes") or {})
    for text in _strings(COMPOSE):  # every $ is a valid interpolation (a bare one fails `docker compose up`)
        assert "$" not in INTERPOLATION.sub("", text), text
    for name, s in services.items():
        assert set(s) <= SERVICE_KEYS, f"{name}: unknown keys {sorted(set(s) - SERVICE_KEYS)}"
        assert "image" in s or "build" in s, name
        assert isinstance(s.get("profiles", []), list) and all(isinstance(p, str) for p in s.get("profiles", []))
        deps = s.get("depends_on") or {}
        for dep in deps:
            assert dep in services, f"{name} depends on undefined service {dep}"
            # a service that always starts cannot depend on one that starts only with a profile
            assert not services[dep].get("profiles") or set(services[dep]["profiles"]) & set(s.get("profiles", [])), \
                f"{name} depends on {dep}, which runs only with profile {services[dep]['profiles']}"
        if isinstance(deps, dict):
            for dep, cond in deps.items():
                assert cond.get("condition", "service_started") in (
                    "service_started", "service_healthy", "service_completed_successfully"), (name, dep)
                if cond.get("condition") == "service_healthy":
                    assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no check"
        for key in ("stop_grace_period",):
            if key in s:
                assert DURATION.match(str(s[key])), (name, key, s[key])
        for key in ("interval", "timeout", "start_period"):
            if key in s.get("healthcheck", {}):
                assert DURATION.match(str(s["healthcheck"][key])), (name, key)
        for p in s.get("ports", []):
            assert PORT.match(_port(p)), (name, p)
        for v in s.get("volumes", []):
            source, target = v.split(":")[:2]
            assert target.startswith("/"), (name, v)
            if source.startswith((".", "/")):  # a bind mount of a file or folder of this repository
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
            else:
                assert source in declared, f"{name} uses volume {source!r}, not declared under volumes:"


def test_compose_refuses_to_start_without_a_push_token():
    env = COMPOSE["x-streamrec"]["environment"]
    m = re.fullmatch(r"\$\{STREAMREC_PUSH_TOKEN:\?([^}]*)\}", env["STREAMREC_SERVING__PUSH_TOKEN"])
    assert m, env["STREAMREC_SERVING__PUSH_TOKEN"]  # `:?`: unset or empty stops compose with the message
    assert "STREAMREC_PUSH_TOKEN" in m.group(1) and ".env" in m.group(1)  # the message says how to set it
    for s in _streamrec_services().values():  # and no service overrides it with a default
        assert "STREAMREC_SERVING__PUSH_TOKEN" not in (s.get("environment") or {}) or \
            s["environment"]["STREAMREC_SERVING__PUSH_TOKEN"] == env["STREAMREC_SERVING__PUSH_TOKEN"]


def test_stop_grace_covers_a_final_checkpoint_and_trainer_variants_own_their_data():
    services = _streamrec_services()
    trainers = {n: s for n, s in services.items() if "train" in _streamrec_argv(s)}
    assert {"trainer", "trainer-gpu", "trainer-0", "trainer-1"} <= set(trainers)
    for name, s in services.items():  # compose's default is 10 s, then SIGKILL
        assert _seconds(s.get("stop_grace_period", "10s")) >= 30, name
    for name, s in trainers.items():  # a final checkpoint flushes the store and fsyncs: give it minutes
        assert _seconds(s["stop_grace_period"]) >= 120, name
    data = {n: next(v.split(":")[0] for v in s["volumes"] if v.split(":")[1] == "/data") for n, s in trainers.items()}
    # two variants on one RocksDB store and checkpoint dir would corrupt each other; a group's ranks share by design
    assert len({data["trainer"], data["trainer-gpu"], data["trainer-0"]}) == 3, data
    assert data["trainer-0"] == data["trainer-1"]
    assert services["producer"].get("profiles"), "the demo producer must not start with the stack"
    assert all(not s.get("profiles") for n, s in services.items() if n in ("serving", "sketch", "trainer"))


def test_image_numba_cache_is_built_for_the_installed_package():
    lines = [ln.strip() for ln in DOCKERFILE.splitlines()]
    text = "\n".join(lines)
    warm = text.index("from streamrec.sketch.kernels import warm")
    assert text.index("NUMBA_CACHE_DIR=/var/cache/streamrec/numba") < warm
    assert text.index("NUMBA_CPU_NAME=generic") < warm  # the cache key holds the CPU: portable, not the builder's
    install = text.index("pip install --no-cache-dir -c constraints.txt --no-deps .")
    removed = text.index("rm -rf /app")
    assert install < removed < warm  # compiled from site-packages, with no source tree left to shadow it
    workdirs = re.findall(r"^WORKDIR (\S+)", DOCKERFILE, re.M)
    assert workdirs[0] == "/app" and workdirs[-1] == "/data", workdirs  # containers never run inside /app
    # what the warm-up compiles is what the processes call: the kernels module keeps its warm() entry point
    from streamrec.sketch import kernels

    assert callable(kernels.warm)


# -- monitoring ------------------------------------------------------------------------------------------------

PROMETHEUS = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
GRAFANA = ROOT / "deploy" / "grafana"


def _exported_names() -> set[str]:
    """Every sample name the three processes' exporters can produce (counters with _total, histograms with
    _bucket/_count/_sum), from the real exporter classes."""
    from streamrec.app.config import load_config
    from streamrec.serving.metrics import ServingMetrics
    from streamrec.sketch.metrics import SketchMetrics
    from tests.helpers.sketch import sketch_state
    from streamrec.trainer.telemetry import PrometheusExporter

    class _Service:  # what ServingMetrics reads of the service
        swaps, events_served, current = 0, 0, None

    exporters = [PrometheusExporter(0), ServingMetrics(_Service(), 0), SketchMetrics(sketch_state(load_config(env={})), 0)]
    trainer = exporters[0]
    trainer.watch_consumer(type("C", (), {"stats": type("S", (), {"events": 0, "records": 0, "bytes": 0})(),
                                          "topic": "events", "last_lag": {0: 1}})())
    names = set()
    for e in exporters:
        for fam in getattr(e, "endpoint").registry.collect():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(fam.type, [""])
            names |= {fam.name + s for s in suffixes}
    return names


def test_prometheus_scrapes_every_process_on_its_configured_port():
    cfg = load_config(ROOT / "deploy" / "streamrec.toml", env={})
    want = {"streamrec-trainer": (cfg.trainer.metrics_host, cfg.trainer.metrics_port, {"trainer", "trainer-gpu", "trainer-0"}),
            "streamrec-sketch": (cfg.sketch.metrics_host, cfg.sketch.metrics_port, {"sketch"}),
            "streamrec-serving": (cfg.serving.metrics_host, cfg.serving.metrics_port, {"serving"}),
            "streamrec-join": (cfg.join.metrics_host, cfg.join.metrics_port, {"join"})}
    jobs = {j["job_name"]: j for j in PROMETHEUS["scrape_configs"]}
    assert set(jobs) == set(want)
    for job, (host, port, names) in want.items():
        assert port > 0 and host == "0.0.0.0", (job, host, port)  # on, and reachable from the prometheus container
        (sd,) = jobs[job]["dns_sd_configs"]
        assert sd["type"] == "A" and sd["port"] == port and set(sd["names"]) == names, (job, sd)
        assert names <= set(COMPOSE["services"]), names
    mon = {n: s for n, s in COMPOSE["services"].items() if "monitoring" in s.get("profiles", [])}
    assert {s["image"].split(":")[0] for s in mon.values()} == {"prom/prometheus", "grafana/grafana"}
    assert all(":" in s["image"] and not s["image"].endswith(":latest") for s in mon.values())  # pinned
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mon["prometheus"]["volumes"]
    for s in mon.values():  # the UIs stay on the machine unless the operator publishes them
        assert all(_port(p).startswith("127.0.0.1:") for p in s.get("ports", [])), s["ports"]


def test_grafana_is_provisioned_with_a_dashboard_of_exported_metrics():
    import json

    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"]
    (prom,) = ds
    assert prom["url"] == "http://prometheus:9090" and prom["type"] == "prometheus"
    (provider,) = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "streamrec.yml").read_text())["providers"]
    mounts = dict(v.split(":")[:2] for v in COMPOSE["services"]["grafana"]["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    dash = json.loads((GRAFANA / "dashboards" / "streamrec.json").read_text())
    exported = _exported_names()
    used = set()
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == prom["uid"], p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            used |= set(re.findall(r"\bstreamrec_[a-z0-9_]+", t["expr"]))
    assert used - exported == set(), f"the dashboard queries metrics no process exports: {sorted(used - exported)}"
    # the pipeline at a glance: each process appears
    assert {n.split("_")[1] for n in used} == {"trainer", "sketch", "serving"}


def test_a_renamed_metric_would_fail_the_dashboard_check():
    """The check above can fail: a name the exporters do not produce is caught."""
    assert "streamrec_trainer_events_trained_total" in _exported_names()
    assert "streamrec_trainer_events_total" not in _exported_names()


def test_setup_compiles_the_numba_kernels_the_image_compiles():
    """``scripts/setup.sh`` (both README commands, CI) warms the same kernels as the image, so no sketch or serving
    process of the demo or the suite compiles them (several compiling at once on a loaded machine stall for a
    minute)."""
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    for call in ("from streamrec.sketch.kernels import warm", "warm()",
                 "from streamrec.serving.idindex import IdIndex", "IdIndex(np.arange(4)).find(np.arange(2), -1)"):
        assert call in DOCKERFILE and call in setup, call


def test_setup_compiles_every_package_folder_to_bytecode():
    """``scripts/setup.sh`` compiles every folder setuptools maps into ``streamrec`` (and the tests) to bytecode, so a
    process started by the demo or the suite reads them compiled, also where PYTHONDONTWRITEBYTECODE is set."""
    import re
    import tomllib

    setup = (ROOT / "scripts" / "setup.sh").read_text()
    call = re.search(r"-m compileall -q -j 0 ([\w ]+)", setup)
    assert call is not None, "setup.sh no longer compiles the sources"
    compiled = set(call.group(1).split())
    folders = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    assert folders and folders | {"tests"} <= compiled, sorted(folders | {"tests"} - compiled)
