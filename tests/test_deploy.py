"""Deploy files agree with the real commands and variables, and keep the hardening rules of
docs/security-deploy.md (no container engine here to run them: they are parsed)."""

from __future__ import annotations

import re
import runpy
import shlex
import shutil
import subprocess
import sys
import zipfile
from datetime import date
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from celeryapp.alerting.channels import load_channels
from celeryapp.domain.calendars import parse_calendar
from celeryapp.domain.names import CONTROL_QUEUES, STEPS_QUEUE
from celeryapp.interfaces.cli import main as chordbeat_cli
from celeryapp.scheduling.calendar_files import read_calendar

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
#: Variables read by the settings object, the contract's and chordbeat's own.
KNOWN_VARS = set(re.findall(r'"(CHORDBEAT_[A-Z_]+)"', (ROOT / "celeryapp" / "config.py").read_text()))
#: Deploy-only: which liveness file the image's HEALTHCHECK reads; where `make run` keeps its state
#: and the port of the Redis it starts.
DEPLOY_VARS = {"CHORDBEAT_ROLE", "CHORDBEAT_RUN_DIR", "CHORDBEAT_LOCAL_REDIS_PORT"}
#: The example alert channels file, and the variables holding its URLs and secrets (not settings:
#: the deployment's own names, read by the workers that send).
ALERT_CHANNELS = DEPLOY / "alert-channels.yaml"
CHANNEL_VARS = {
    name
    for channel in load_channels(str(ALERT_CHANNELS)).values()
    for name in (channel.url_env, channel.secret_env, channel.smtp_url_env)
    if name is not None
}
CELERY_ROLES = {"worker", "beat", "flower"}
#: The example business calendars (CHORDBEAT_CALENDARS_DIR), mounted read-only.
CALENDARS = DEPLOY / "calendars"
#: The control worker's command line in every deploy file.
CONTROL_WORKER = ["-Q", "chordbeat.control,celery", "-P", "threads", "-c", "4"]
RESPAWN = ["python", "deploy/local/respawn.py"]
#: compose's Redis: renders the ACL file from the environment and runs Redis with it.
REDIS_START = DEPLOY / "redis" / "start.sh"
ACL_FILE = DEPLOY / "redis" / "users.acl"
#: The Redis ACL user each role's process connects as (deploy/redis/users.acl).
ROLE_USERS = {
    "worker": "chordbeat",
    "beat": "chordbeat",
    "web": "chordbeat",
    "metrics": "chordbeat",
    "db upgrade": "chordbeat",
    "flower": "chordbeat-monitor",
}
#: The ACL user of other services calling chordbeat: named by no process of ours.
SERVICE_USER = "chordbeat-service"
SYSTEMD_SANDBOX = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "RestrictSUIDSGID": "yes",
    "RestrictNamespaces": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "SystemCallFilter": "@system-service",
    "UMask": "0077",
}


def check_command(argv: list[str]) -> str:
    """Return the role a command starts, failing if it is not a real command line of ours."""
    program = Path(argv[0]).name
    if program == "celery":
        assert argv[1:3] == ["-A", "celeryapp"], argv
        role = argv[3]
        assert role in CELERY_ROLES, argv
        if role == "flower":
            assert "--conf=flower.cfg" in argv, argv
        return role
    assert program == "chordbeat", argv
    ctx = click.Context(chordbeat_cli)
    command = chordbeat_cli.get_command(ctx, argv[1])
    assert command is not None, f"no such chordbeat command: {argv}"
    if isinstance(command, click.Group):
        assert command.get_command(ctx, argv[2]) is not None, argv
        return " ".join(argv[1:3])
    for option in (a for a in argv[2:] if a.startswith("--")):
        assert any(option in p.opts for p in command.params), f"{argv}: unknown option {option}"
    return argv[1]


def worker_kind(argv: list[str]) -> str:
    """``control`` or ``steps``: every worker we ship has its queues, and no step worker takes a
    control queue (a long step would make service calls wait)."""
    assert "-Q" in argv, f"{argv}: a worker without -Q takes every queue"
    queues = argv[argv.index("-Q") + 1].split(",")
    if set(queues) & CONTROL_QUEUES:
        assert argv[argv.index("-Q") :][: len(CONTROL_WORKER)] == CONTROL_WORKER, argv
        return "control"
    assert STEPS_QUEUE in queues, argv
    return "steps"


def variables(text: str) -> set[str]:
    return set(re.findall(r"\bCHORDBEAT_[A-Z_]+\b", text))


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


def k8s_documents() -> list[dict[str, Any]]:
    return [d for path in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


def systemd_units() -> dict[str, dict[str, list[str]]]:
    """Each unit's ``[Service]`` (and ``[Unit]``) keys with all their values, in order."""
    units = {}
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        keys: dict[str, list[str]] = {}
        for line in path.read_text().splitlines():
            if "=" in line and not line.startswith(("#", "[")):
                key, value = line.split("=", 1)
                keys.setdefault(key, []).append(value)
        units[path.name] = keys
    return units


def config_map(name: str) -> dict[str, str]:
    (data,) = (d["data"] for d in k8s_documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
    return dict(data)


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def procfile() -> dict[str, list[str]]:
    lines = (DEPLOY / "local" / "Procfile").read_text().splitlines()
    return {name: shlex.split(command) for name, command in (line.split(":", 1) for line in lines if line)}


def test_documented_variables_are_exactly_those_the_settings_read() -> None:
    reference = (ROOT / "docs" / "configuration.md").read_text()
    assert {"CHORDBEAT_BROKER_URL", "CHORDBEAT_DATABASE_URL", "CHORDBEAT_HEARTBEAT_TTL"} <= KNOWN_VARS
    for name in KNOWN_VARS | DEPLOY_VARS - {"CHORDBEAT_ROLE"}:
        assert f"`{name}`" in reference, f"{name} is not documented in docs/configuration.md"
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            unknown = variables(path.read_text()) - KNOWN_VARS - DEPLOY_VARS - CHANNEL_VARS
            assert not unknown, f"{path.relative_to(ROOT)} uses unknown variables {unknown}"


def test_compose_services_run_real_commands_with_healthchecks() -> None:
    services: dict[str, Any] = compose()["services"]
    roles = {}
    for name, service in services.items():
        if "command" in service and service.get("build"):
            roles[name] = check_command(service["command"])
        if name != "migrate":
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    assert roles == {
        "migrate": "db upgrade",
        "worker": "worker",
        "control": "worker",
        "beat-a": "beat",
        "beat-b": "beat",
        "flower": "flower",
        "metrics": "metrics",
        "web": "web",
    }
    assert services["worker"]["healthcheck"]["test"] == ["CMD", "chordbeat", "health", "worker"]
    assert services["control"]["healthcheck"]["test"] == ["CMD", "chordbeat", "health", "worker"]
    assert services["beat-a"]["healthcheck"]["test"] == ["CMD", "chordbeat", "health", "beat"]
    assert services["redis"]["command"] == ["bash", "/etc/chordbeat-redis/start.sh"]
    redis = shlex.split(REDIS_START.read_text().rsplit("exec ", 1)[1])
    assert redis[redis.index("--appendonly") + 1] == "yes"
    assert redis[redis.index("--maxmemory-policy") + 1] == "noeviction"
    assert redis[redis.index("--aclfile") + 1] == "$rendered"
    assert "rendered=${REDIS_ACL_RENDERED:-/tmp/users.acl}" in REDIS_START.read_text()
    assert services["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_kubernetes_manifests_run_real_commands_with_probes() -> None:
    docs = k8s_documents()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("ConfigMap", "chordbeat"), ("Job", "chordbeat-migrate")} <= kinds
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {
        "chordbeat-worker",
        "chordbeat-control",
        "chordbeat-beat",
        "chordbeat-flower",
        "chordbeat-metrics",
        "chordbeat-web",
    }
    assert deployments["chordbeat-beat"]["spec"]["replicas"] == 2
    for name, deployment in deployments.items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        check_command(container["command"])
        assert "livenessProbe" in container, f"{name} has no liveness probe"
        probe = container["livenessProbe"].get("exec", {}).get("command")
        if probe:
            assert check_command(probe) == "health"
    job = next(d for d in docs if d["kind"] == "Job")
    assert check_command(job["spec"]["template"]["spec"]["containers"][0]["command"]) == "db upgrade"


def test_systemd_units_run_real_commands() -> None:
    roles = set()
    for name, unit in systemd_units().items():
        (exec_start,) = unit["ExecStart"]
        roles.add(check_command(shlex.split(exec_start)))
        # Every unit reads the shared settings first, but Flower: they hold the app's passwords.
        shared = unit["EnvironmentFile"][0] == "/etc/chordbeat/chordbeat.env"
        assert shared != (name == "chordbeat-flower.service"), name
    assert roles == {"db upgrade", "worker", "beat", "flower", "metrics", "web"}


def test_make_run_runs_real_commands_each_restarted_when_it_dies() -> None:
    lines = procfile()
    assert set(lines) == {"worker", "control", "beat", "flower", "web", "ready"}
    for name, argv in lines.items():
        assert argv[:2] == RESPAWN, f"{name} is not restarted when it dies"
        if name != "ready":
            check_command(argv[2:])
    assert lines["ready"][2:4] == ["python", "deploy/local/ready.py"] and (DEPLOY / "local" / "ready.py").is_file()
    redis = (DEPLOY / "local" / "run.sh").read_text()
    assert "requirepass $LOCAL_REDIS_PASSWORD" in redis and "--requirepass" not in redis
    # Redis, when make run starts one, is a server supervise.py stops after the processes above.
    assert 'servers=(--server "python deploy/local/respawn.py redis-server $run_dir/redis.conf")' in redis
    assert 'exec python deploy/local/supervise.py "${servers[@]}" -- honcho -f deploy/local/Procfile' in redis


def test_every_worker_runs_steps_or_control_never_both() -> None:
    """Step workers take the steps queue, one control worker per deploy takes the control queues."""
    workers = {
        "compose": [s["command"] for s in compose()["services"].values() if s.get("command", [""])[3:4] == ["worker"]],
        "k8s": [
            c["command"]
            for d in k8s_documents()
            if d["kind"] == "Deployment"
            for c in d["spec"]["template"]["spec"]["containers"]
            if c["command"][3:4] == ["worker"]
        ],
        "systemd": [
            shlex.split(u["ExecStart"][0])[1:] for u in systemd_units().values() if " worker " in u["ExecStart"][0]
        ],
        "make run": [argv[2:] for argv in procfile().values() if argv[5:6] == ["worker"]],
    }
    for where, commands in workers.items():
        kinds = sorted(worker_kind(argv) for argv in commands)
        assert kinds == ["control", "steps"], f"{where}: {kinds}"


def test_compose_is_hardened() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    services: dict[str, Any] = compose()["services"]
    for name, service in services.items():
        assert service["restart"] == ("no" if name == "migrate" else "unless-stopped"), name
        assert "env_file" not in service, f"{name} would see every secret of deploy/.env"
        if service.get("build"):
            assert service["read_only"] is True and service["cap_drop"] == ["ALL"], name
            assert "no-new-privileges:true" in service["security_opt"], name
            env = service["environment"]
            user, password = ("chordbeat-monitor", "MONITOR") if name == "flower" else ("chordbeat", "APP")
            assert env["CHORDBEAT_BROKER_URL"].startswith(f"redis://{user}:${{REDIS_{password}_PASSWORD:?"), name
            if name == "flower":
                # What Flower holds, a Flower login's worst case can reach: no app password.
                assert not any("APP_PASSWORD" in str(value) for value in env.values()), env
                assert "CHORDBEAT_DATABASE_URL" not in env
            else:
                role = re.match(r"postgresql\+psycopg://(\w+):", env["CHORDBEAT_DATABASE_URL"])
                assert role is not None
                assert role.group(1) == ("chordbeat_migrate" if name == "migrate" else "chordbeat_app")
            assert ("FLOWER_BASIC_AUTH" in env) == (name == "flower"), name
            assert ("CHORDBEAT_WEB_USERS" in env) == (name == "web"), name
    postgres = services["postgres"]
    assert "POSTGRES_USER" not in postgres["environment"], "the superuser must not be the application's role"
    assert "./postgres:/docker-entrypoint-initdb.d:ro" in postgres["volumes"]
    # Every secret is required: compose refuses to start with one unset or empty.
    for secret in re.findall(r"\$\{((?:REDIS|POSTGRES|FLOWER|WEB)_[A-Z_]+)([^}]*)\}", text):
        assert secret[1].startswith(":?"), secret
    example = env_file(DEPLOY / "env.example")
    assert all(example[k] == "" for k in example if not k.startswith("CHORDBEAT_")), "env.example ships a value"


def test_every_process_reads_the_alert_channels_and_only_the_control_worker_gets_their_secrets() -> None:
    channels = load_channels(str(ALERT_CHANNELS))
    assert set(channels) == {"ops-webhook", "ops-slack", "ops-mail"}
    assert {"OPS_WEBHOOK_URL", "OPS_WEBHOOK_SECRET", "OPS_SLACK_URL", "CHORDBEAT_SMTP_URL"} == CHANNEL_VARS
    # compose: every app process names the file, mounted beside the schedule file; the secrets
    # reach the control worker (which sends) and nothing else: no step code runs beside them.
    services: dict[str, Any] = compose()["services"]
    for name, service in services.items():
        if not service.get("build") or name == "flower":  # Flower applies nothing
            continue
        env, volumes = service["environment"], service.get("volumes", [])
        assert env["CHORDBEAT_ALERT_CHANNELS"] == "/config/alert-channels.yaml", name
        if "./schedules.yaml:/config/schedules.yaml:ro" in volumes:
            assert "./alert-channels.yaml:/config/alert-channels.yaml:ro" in volumes, name
        given = CHANNEL_VARS & set(env)
        assert given == (CHANNEL_VARS if name == "control" else set()), name
        for variable in given:
            assert env[variable] == f"${{{variable}:-}}", f"{name}: {variable} is optional and from deploy/.env"
    example = env_file(DEPLOY / "env.example")
    assert all(example[v] == "" for v in CHANNEL_VARS)
    # Kubernetes: the ConfigMap names the file and holds the same channels; the Secret is the workers'.
    config, files = (config_map(name) for name in ("chordbeat", "chordbeat-schedules"))
    assert config["CHORDBEAT_ALERT_CHANNELS"] == "/config/alert-channels.yaml"
    shipped = yaml.safe_load(ALERT_CHANNELS.read_text())
    assert yaml.safe_load(files["alert-channels.yaml"]) == shipped
    with_secret = {
        doc["metadata"]["name"]
        for doc in k8s_documents()
        if doc["kind"] == "Deployment"
        for container in doc["spec"]["template"]["spec"]["containers"]
        if {"name": "chordbeat-alerts", "optional": True} in [s.get("secretRef") for s in container["envFrom"]]
    }
    assert with_secret == {"chordbeat-control"}
    documented = (DEPLOY / "k8s" / "config.yaml").read_text()
    assert all(f"\n#     {v}=" in documented for v in CHANNEL_VARS)
    # systemd: every unit reads the file's name; the secrets file is the control unit's only.
    assert env_file(DEPLOY / "systemd" / "chordbeat.env")["CHORDBEAT_ALERT_CHANNELS"] == (
        "/etc/chordbeat/alert-channels.yaml"
    )
    assert set(env_file(DEPLOY / "systemd" / "alerts.env")) >= CHANNEL_VARS
    for name, unit in systemd_units().items():
        role = check_command(shlex.split(unit["ExecStart"][0]))
        sends = role == "worker" and "chordbeat.control" in unit["ExecStart"][0]
        assert ("-/etc/chordbeat/alerts.env" in unit["EnvironmentFile"]) == sends, name


def test_the_example_calendar_is_real_and_every_process_that_fires_applies_or_previews_reads_it() -> None:
    (shipped,) = CALENDARS.iterdir()
    text = shipped.read_text()
    holidays = read_calendar(str(CALENDARS), shipped.name)
    assert shipped.name == "uk-bank-holidays" and holidays == parse_calendar(text) and text.startswith("#")
    # England and Wales, 2026 and 2027 (gov.uk/bank-holidays): eight a year, weekdays, substitutes included.
    assert sorted({d.year for d in holidays}) == [2026, 2027] and len(holidays) == 16
    assert all(d.weekday() < 5 for d in holidays)
    assert {date(2026, 4, 3), date(2026, 12, 28), date(2027, 3, 29), date(2027, 12, 27), date(2027, 12, 28)} < holidays
    reads = {"worker", "control", "beat-a", "beat-b", "web"}
    # compose: every app process names the directory; those that fire, apply or preview mount it.
    for name, service in compose()["services"].items():
        if service.get("build") and name != "flower":  # Flower fires, applies and previews nothing
            volumes = service.get("volumes", [])
            assert service["environment"]["CHORDBEAT_CALENDARS_DIR"] == "/config/calendars", name
            mounted = "./calendars:/config/calendars:ro" in volumes
            assert mounted >= (name in reads or "./schedules.yaml:/config/schedules.yaml:ro" in volumes), name
    # Kubernetes: the ConfigMap names it, chordbeat-calendars holds the file, mounted read-only.
    directory = config_map("chordbeat")["CHORDBEAT_CALENDARS_DIR"]
    assert config_map("chordbeat-calendars") == {shipped.name: text}
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in k8s_documents() if d["kind"] == "Deployment"}
    for name in ("chordbeat-worker", "chordbeat-control", "chordbeat-beat", "chordbeat-web"):
        (container,) = pods[name]["containers"]
        assert {"name": "calendars", "mountPath": directory, "readOnly": True} in container["volumeMounts"], name
        assert {"name": "calendars", "configMap": {"name": "chordbeat-calendars"}} in pods[name]["volumes"], name
    # systemd: chordbeat.env, which every unit reads; make run: the example directory.
    assert env_file(DEPLOY / "systemd" / "chordbeat.env")["CHORDBEAT_CALENDARS_DIR"] == "/etc/chordbeat/calendars"
    run = (DEPLOY / "local" / "run.sh").read_text()
    assert 'export CHORDBEAT_CALENDARS_DIR="${CHORDBEAT_CALENDARS_DIR:-$PWD/deploy/calendars}"' in run


def test_kubernetes_pods_are_hardened_and_ship_no_secret_values() -> None:
    docs = k8s_documents()
    assert not [d for d in docs if d["kind"] == "Secret"], "applying the manifests would overwrite a real Secret"
    documented = (DEPLOY / "k8s" / "config.yaml").read_text()
    for doc in docs:
        if doc["kind"] not in {"Deployment", "Job"}:
            continue
        name, pod = doc["metadata"]["name"], doc["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0, name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        tmp = next(v["name"] for v in pod["volumes"] if "emptyDir" in v)
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"] == {"drop": ["ALL"]}, name
            assert {"name": tmp, "mountPath": "/tmp"} in container["volumeMounts"], f"{name}: no writable /tmp"
            secrets = {s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s}
            if doc["kind"] == "Job":
                assert secrets == {"chordbeat-migrate"}, name
            elif name == "chordbeat-flower":
                assert secrets == {"chordbeat-flower"}, "Flower would hold the app's passwords"
            else:
                assert "chordbeat" in secrets and "chordbeat-flower" not in secrets, name
            assert ("chordbeat-web" in secrets) == (name == "chordbeat-web"), name
            for secret in secrets:
                assert f"kubectl create secret generic {secret} " in documented, f"{secret} is not documented"
    assert "CHORDBEAT_BROKER_URL=redis://chordbeat:APP_PASSWORD@" in documented
    assert "chordbeat_app:APP_PASSWORD@" in documented and "chordbeat_migrate:MIGRATE_PASSWORD@" in documented


def test_systemd_units_are_sandboxed_and_restart() -> None:
    units = systemd_units()
    assert "chordbeat-control.service" in units
    for name, unit in units.items():
        for key, value in SYSTEMD_SANDBOX.items():
            assert unit.get(key) == [value], f"{name}: {key}={unit.get(key)}"
        if unit.get("Type") != ["oneshot"]:
            assert unit["Restart"] == ["always"] and float(unit["RestartSec"][0]) <= 10, name
        role = check_command(shlex.split(unit["ExecStart"][0]))
        if role == "worker":
            # Only the worker gets SIGTERM (a warm shutdown): systemd's default also sends it to
            # the pool processes, which die of it mid-step.
            assert unit["KillMode"] == ["mixed"] and unit["KillSignal"] == ["SIGTERM"], name
        if role in {"worker", "beat"}:
            # The liveness files and beat's state need one writable directory: /run/chordbeat.
            assert unit["RuntimeDirectory"] == ["chordbeat"] and unit["RuntimeDirectoryPreserve"] == ["yes"], name
        if role == "flower":
            assert unit["StateDirectory"] == ["chordbeat-flower"], name
            assert "FLOWER_DB=/var/lib/chordbeat-flower/flower.db" in unit["Environment"], name
        assert ("/etc/chordbeat/migrate.env" in unit["EnvironmentFile"]) == (role == "db upgrade"), name
        if role == "flower":
            assert unit["EnvironmentFile"] == ["/etc/chordbeat/flower.env"], "Flower would hold the app's passwords"
            assert unit["InaccessiblePaths"] == ["/etc/chordbeat"], name
        else:
            assert "/etc/chordbeat/chordbeat.env" in unit["EnvironmentFile"], name
        assert ("/etc/chordbeat/web.env" in unit["EnvironmentFile"]) == (role == "web"), name
    env = env_file(DEPLOY / "systemd" / "chordbeat.env")
    assert env["CHORDBEAT_BROKER_URL"].startswith("redis://chordbeat:APP_PASSWORD@")
    assert env["CHORDBEAT_DATABASE_URL"].startswith("postgresql+psycopg://chordbeat_app:")
    assert env["CHORDBEAT_HEALTH_DIR"] == "/run/chordbeat"
    migrate = env_file(DEPLOY / "systemd" / "migrate.env")
    assert migrate["CHORDBEAT_DATABASE_URL"].startswith("postgresql+psycopg://chordbeat_migrate:")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_accepts_the_units_and_rates_them_ok(tmp_path: Path) -> None:
    venv = Path(sys.executable).parent
    for unit in (DEPLOY / "systemd").glob("*.service"):
        # Real paths on this machine, so verify checks the directives, not our install layout.
        text = unit.read_text().replace("/opt/chordbeat/.venv/bin/", f"{venv}/").replace("/opt/chordbeat", str(ROOT))
        (tmp_path / unit.name.replace("@.", "@1.")).write_text(text)
    units = sorted(str(p) for p in tmp_path.iterdir())
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *units], capture_output=True, text=True, timeout=120
    )
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr
    for unit in units:
        security = subprocess.run(
            ["systemd-analyze", "security", "--offline=yes", unit], capture_output=True, text=True, timeout=120
        )
        exposure = re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout)
        assert exposure is not None and float(exposure.group(1)) <= 2.0, security.stdout[-500:]


def test_the_image_runs_as_a_user_that_cannot_change_its_code() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    user = re.search(r"^USER (\S+)", dockerfile, re.M)
    assert user is not None and user.group(1).split(":")[0] not in {"root", "0"}
    uid = user.group(1).split(":")[0]
    assert uid.isdigit(), "a numeric USER lets Kubernetes check runAsNonRoot"
    # Code is copied and installed as root; nothing hands it to the runtime user.
    assert "--chown" not in dockerfile and not re.search(rf"chown\b[^\n]*(chordbeat|{uid})\S* +/app", dockerfile)
    assert dockerfile.index("COPY celeryapp") < dockerfile.index("USER ")
    assert 'CMD chordbeat health "$CHORDBEAT_ROLE"' in dockerfile
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None and check_command(yaml.safe_load(cmd.group(1))) == "worker"
    for copied in re.findall(r"^COPY (\S+)", dockerfile, re.M):
        assert (ROOT / copied).exists(), copied


GOOD_PASSWORD = "ops:Vq3-x81Lz0pP2mNs"
GOOD_COOKIE = "3Gk9wQ_p1Zr8Tt0vY6uB4nM2cX7aL5sD"


@pytest.mark.parametrize(
    ("basic_auth", "cookie", "refused"),
    [
        (GOOD_PASSWORD, GOOD_COOKIE, None),
        ("", GOOD_COOKIE, "without authentication"),
        ("ops:short-pw", GOOD_COOKIE, "shorter than 12"),
        ("ops:chordbeat-local", GOOD_COOKIE, "placeholder"),
        ("ops:change-me-now-please", GOOD_COOKIE, "placeholder"),
        ("operations-team:operations-team", GOOD_COOKIE, "placeholder"),
        ("ops:password1234", GOOD_COOKIE, "placeholder"),
        (f"{GOOD_PASSWORD},ops2:weak", GOOD_COOKIE, "'ops2'"),
        ("ops:FLOWER_PASSWORD", GOOD_COOKIE, "placeholder"),
        (GOOD_PASSWORD, "", "FLOWER_COOKIE_SECRET"),
        (GOOD_PASSWORD, "local-development-only", "FLOWER_COOKIE_SECRET"),
        (GOOD_PASSWORD, "change-me-to-a-long-random-string", "FLOWER_COOKIE_SECRET"),
    ],
)
def test_flower_refuses_placeholder_and_short_credentials(
    monkeypatch: pytest.MonkeyPatch, basic_auth: str, cookie: str, refused: str | None
) -> None:
    monkeypatch.delenv("FLOWER_AUTH", raising=False)
    monkeypatch.setenv("FLOWER_BASIC_AUTH", basic_auth)
    monkeypatch.setenv("FLOWER_COOKIE_SECRET", cookie)
    if refused is None:
        config = runpy.run_path(str(ROOT / "flower.cfg"))
        assert config["cookie_secret"] == cookie and config["address"] == "127.0.0.1"
        return
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / "flower.cfg"))
    assert refused in str(exit_.value), exit_.value


def test_the_shipped_example_credentials_do_not_start_flower(monkeypatch: pytest.MonkeyPatch) -> None:
    examples = env_file(DEPLOY / "systemd" / "flower.env")
    for variable, good in (("FLOWER_BASIC_AUTH", GOOD_PASSWORD), ("FLOWER_COOKIE_SECRET", GOOD_COOKIE)):
        monkeypatch.setenv("FLOWER_BASIC_AUTH", GOOD_PASSWORD)
        monkeypatch.setenv("FLOWER_COOKIE_SECRET", GOOD_COOKIE)
        runpy.run_path(str(ROOT / "flower.cfg"))
        monkeypatch.setenv(variable, examples[variable])
        with pytest.raises(SystemExit, match=variable):
            runpy.run_path(str(ROOT / "flower.cfg"))
        monkeypatch.setenv(variable, good)


@pytest.mark.parametrize("argv", [["celery", "-A", "other", "worker"], ["chordbeat", "nope"]])
def test_the_checker_rejects_commands_that_do_not_exist(argv: list[str]) -> None:
    with pytest.raises(AssertionError):
        check_command(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["celery", "-A", "celeryapp", "worker", "-l", "INFO"],
        ["celery", "-A", "celeryapp", "worker", "-Q", "chordbeat,celery"],
        ["celery", "-A", "celeryapp", "worker", "-Q", "chordbeat.control,celery", "-c", "1"],
    ],
)
def test_the_checker_rejects_workers_that_mix_steps_and_control(argv: list[str]) -> None:
    with pytest.raises(AssertionError):
        worker_kind(argv)


def test_the_wheel_holds_every_package_and_setuptools_says_nothing(tmp_path: Path) -> None:
    """What `make run`'s install and the image's `pip install .` get: every package of the layer
    table with its data (templates, static files, migrations), and no setuptools warnings
    (a package missing from pyproject installed only as "data", with about 90 lines of them)."""
    # Built from a copy: setuptools builds in the source tree, and a build/ left in the checkout
    # would be linted and type-checked as a second copy of the code.
    source = tmp_path / "source"
    for part in ("celeryapp", "tasks", "models"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, source / part)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--progress-bar", "off", "-w", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr
    said = built.stdout + built.stderr
    for noise in ("Warning", "would be ignored", "deprecated", "absent from the `packages`"):
        assert noise not in said, said
    (wheel,) = tmp_path.glob("chordbeat-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        str(path.relative_to(ROOT))
        for package in ("celeryapp", "tasks", "models")
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert expected - names == set()


def test_flower_control_is_on_or_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWER_BASIC_AUTH", GOOD_PASSWORD)
    monkeypatch.setenv("FLOWER_COOKIE_SECRET", GOOD_COOKIE)
    monkeypatch.setenv("CHORDBEAT_FLOWER_CONTROL", "maybe")
    with pytest.raises(SystemExit, match="CHORDBEAT_FLOWER_CONTROL must be on or off"):
        runpy.run_path(str(ROOT / "flower.cfg"))


# No credential on a command line: ps shows every process's arguments to every user of the host
# (and compose and Kubernetes show commands to whoever may inspect a container).

#: Options whose value is a password or token.
CREDENTIAL_OPTIONS = {"-a", "--pass", "--password", "--requirepass", "--masterauth", "--token", "--secret"}
_URL_PASSWORD = re.compile(r"://[^/@\s:]*:[^@/\s]+@")
_CREDENTIAL_EXPANSION = re.compile(r"\$\{?!?\w*(?:PASSWORD|PASSWD|SECRET|TOKEN|AUTH|_PASS)\b", re.I)
_EXPANDED = re.compile(r"\$\{?!?(\w+|[@*])")
_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", "((", "))", ";;", "{", "}", "$(", "`"}
_REDIRECTIONS = {">", ">>", "<", "<<", "<<<", ">&", "<&", ">|"}
#: The first words of commands that run no program of their own (their arguments reach no ps).
SHELL_BUILTINS = {
    ":",
    ".",
    "[",
    "[[",
    "]]",
    "source",
    "echo",
    "printf",
    "export",
    "local",
    "declare",
    "readonly",
    "set",
    "unset",
    "cd",
    "umask",
    "read",
    "test",
    "return",
    "exit",
    "shift",
    "trap",
    "wait",
    "true",
    "false",
    "command",
    "eval",
    "if",
    "then",
    "elif",
    "else",
    "fi",
    "for",
    "in",
    "do",
    "done",
    "while",
    "until",
    "case",
    "esac",
    "!",
    "$",
}
_KEYWORDS = {"if", "then", "elif", "else", "do", "while", "until", "!", "exec", "time"}


def credential_arguments(argv: list[str], tainted: frozenset[str] = frozenset()) -> list[str]:
    """The arguments of ``argv`` (its program left out) that are, or expand, a credential."""
    return [
        arg
        for arg in argv[1:]
        if arg.split("=", 1)[0] in CREDENTIAL_OPTIONS
        or _URL_PASSWORD.search(arg)
        or _CREDENTIAL_EXPANSION.search(arg)
        or set(_EXPANDED.findall(arg)) & tainted
    ]


def shell_commands(line: str) -> list[list[str]]:
    """The simple commands of a line of shell, words unquoted, redirections and leading
    assignments and keywords dropped."""
    lexer = shlex.shlex(line.replace("$(", " $( "), posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote: a continuation this reader does not join
        return []
    commands, current, skip = [], [], False
    for word in words:
        if skip:
            skip = False
        elif word in _REDIRECTIONS:
            skip = True
        elif word in _OPERATORS:
            commands.append(current)
            current = []
        else:
            current.append(word)
    commands.append(current)
    cleaned = []
    for argv in commands:
        while argv and (re.match(r"^\w+=", argv[0]) or argv[0] in _KEYWORDS):
            argv = argv[1:]
        if argv:
            cleaned.append(argv)
    return cleaned


def _script_lines(text: str) -> list[str]:
    """A script's lines, continuations joined, without comments and here-documents' bodies."""
    lines: list[str] = []
    heredoc = None
    for line in text.replace("\\\n", " ").splitlines():
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
        elif not line.lstrip().startswith("#"):
            if (opened := re.search(r"<<-?\s*'?(\w+)'?", line)) is not None:
                heredoc = opened.group(1)
            lines.append(line)
    return lines


def _credential_variables(lines: list[str]) -> frozenset[str]:
    """The variables assigned a credential, or a value made with one (to a fixed point)."""
    tainted: set[str] = set()
    while True:
        before = set(tainted)
        for line in lines:
            for name, value in re.findall(r"(?:^|[\s;])(\w+)=(\S.*)$", line):
                if _CREDENTIAL_EXPANSION.search(value) or set(_EXPANDED.findall(value)) & tainted:
                    tainted.add(name)
        if tainted == before:
            return frozenset(tainted)


def script_command_lines(text: str) -> list[tuple[list[str], frozenset[str]]]:
    """Each program a shell script runs, with the variables holding a credential where it runs
    (assigned from one, or a function's positional parameters when it is called with one)."""
    lines = _script_lines(text)
    tainted = _credential_variables(lines)
    functions = {m.group(1): m.group(2) for line in lines if (m := re.match(r"^\s*(\w+)\(\)\s*\{(.*)\}\s*$", line))}
    found: list[tuple[list[str], frozenset[str]]] = []

    def run(line: str, taint: frozenset[str]) -> None:
        for argv in shell_commands(line):
            if argv[0] in functions:
                if credential_arguments(argv, taint):
                    run(functions[argv[0]], taint | {str(n) for n in range(1, 10)} | {"@", "*"})
            elif argv[0] not in SHELL_BUILTINS:
                found.append((argv, taint))

    for line in lines:
        if not re.match(r"^\s*\w+\(\)\s*\{", line):
            run(line, tainted)
    return found


CommandLines = dict[str, list[tuple[list[str], frozenset[str]]]]


def _compose_command_lines(lines: CommandLines) -> None:
    for name, service in compose()["services"].items():
        for key in ("command", "entrypoint"):
            if isinstance(service.get(key), list):
                lines.setdefault(f"compose {name} {key}", []).append((service[key], frozenset()))
        test = service.get("healthcheck", {}).get("test") or []
        shell = shell_commands(test[1]) if test[:1] == ["CMD-SHELL"] else [test[1:]] if test[:1] == ["CMD"] else []
        lines.setdefault(f"compose {name} healthcheck", []).extend((argv, frozenset()) for argv in shell)


def _k8s_command_lines(lines: CommandLines) -> None:
    for doc in k8s_documents():
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            where = lines.setdefault(f"k8s {doc['metadata']['name']}", [])
            where.append((container.get("command", []) + container.get("args", []), frozenset()))
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if command := container.get(probe, {}).get("exec", {}).get("command"):
                    where.append((command, frozenset()))


def deploy_command_lines() -> CommandLines:
    """Every command line a deploy file starts (or a healthcheck or probe runs), by where it is."""
    lines: CommandLines = {}
    _compose_command_lines(lines)
    _k8s_command_lines(lines)
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        lines[f"systemd {path.name}"] = [
            (shlex.split(line.split("=", 1)[1].lstrip("-@+!:")), frozenset())
            for line in path.read_text().splitlines()
            if line.startswith("Exec")
        ]
    lines["Procfile"] = [(argv, frozenset()) for argv in procfile().values()]
    docker = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    lines["Dockerfile"] = [
        (argv, frozenset())
        for line in docker
        if line.startswith(("RUN ", "CMD ", "HEALTHCHECK "))
        for argv in shell_commands(
            line.rsplit(" CMD ", 1)[-1] if line.startswith("HEALTHCHECK") else line.split(" ", 1)[1]
        )
    ]
    makefile = (ROOT / "Makefile").read_text().splitlines()
    lines["Makefile"] = [
        (argv, frozenset())
        for line in makefile
        if line.startswith("\t")
        for argv in shell_commands(line.strip().lstrip("@-"))
    ]
    for path in sorted(DEPLOY.rglob("*.sh")):
        lines[str(path.relative_to(ROOT))] = script_command_lines(path.read_text())
    return lines


def test_no_deploy_file_puts_a_credential_on_a_command_line() -> None:
    """The compose healthcheck ran ``redis-cli -a "$REDIS_PASSWORD"`` and Redis ``--requirepass``;
    init-roles.sh gave psql the roles' passwords with ``-v``; ``make run`` gave python the broker
    URL with its password. Each now reads its secret from a file or the environment."""
    # The Secrets are made from files: a value given with --from-literal is in kubectl's arguments.
    for documented in (DEPLOY / "k8s" / "config.yaml", ROOT / "docs" / "operations.md"):
        assert "--from-literal=" not in documented.read_text(), documented
    lines = deploy_command_lines()
    assert {"compose redis healthcheck", "deploy/local/run.sh", "deploy/postgres/init-roles.sh", "Makefile"} <= set(
        lines
    ), sorted(lines)
    assert sum(len(commands) for commands in lines.values()) > 60
    leaks = {
        where: found
        for where, commands in lines.items()
        for argv, taint in commands
        if (found := credential_arguments(argv, taint))
    }
    assert leaks == {}


@pytest.mark.parametrize(
    "script",
    [
        # The forms this test was written against: each must be caught.
        'healthcheck: redis-cli -a "$REDIS_PASSWORD" --no-auth-warning ping | grep -q PONG',
        "redis-server --appendonly yes --requirepass ${REDIS_PASSWORD:?set it}",
        'psql --dbname "$POSTGRES_DB" -v app_password="$POSTGRES_APP_PASSWORD" -f roles.psql',
        'ours="redis://:$LOCAL_REDIS_PASSWORD@127.0.0.1:6379/0"\n'
        'answers() { python -c "import redis,sys; redis.Redis.from_url(sys.argv[1]).ping()" "$1" 2>/dev/null; }\n'
        'if answers "$ours"; then echo up; fi',
        "celery -A celeryapp worker -b redis://chordbeat:s3cret@redis:6379/0",
    ],
)
def test_the_checker_catches_credentials_on_command_lines(script: str) -> None:
    commands = script_command_lines(script.removeprefix("healthcheck: "))
    assert any(credential_arguments(argv, taint) for argv, taint in commands), commands


def acl_users() -> set[str]:
    return {line.split()[1] for line in ACL_FILE.read_text().splitlines() if line.startswith("user ")} - {"default"}


def url_user(url: str) -> str:
    found = re.match(r"redis://([^:@/]*):", url)
    assert found is not None and found.group(1), f"{url}: names no Redis user"
    return found.group(1)


def test_each_role_connects_as_its_own_redis_acl_user_in_every_deploy_file() -> None:
    """deploy/redis/users.acl's users are the ones deploy files use: workers, beat, the dashboard
    and metrics as ``chordbeat``, Flower as ``chordbeat-monitor``; ``chordbeat-service`` is for
    other services' callers, given a password and used by no process of ours."""
    users = acl_users()
    assert users == {*ROLE_USERS.values(), SERVICE_USER}
    used: set[str] = set()
    # compose: each service's URL; Redis renders every user's hash from its own variable.
    services: dict[str, Any] = compose()["services"]
    for name, service in services.items():
        if service.get("build") and name != "migrate":
            role = check_command(service["command"])
            used.add(user := url_user(service["environment"]["CHORDBEAT_BROKER_URL"]))
            assert user == ROLE_USERS[role], name
    redis = services["redis"]
    (health_user,) = re.findall(r"--user (\S+)", redis["healthcheck"]["test"][1])
    assert health_user in users and "REDISCLI_AUTH" in redis["environment"]
    placeholders = set(re.findall(r"\$\{REDIS_ACL_(\w+)_SHA256\}", ACL_FILE.read_text()))
    start = REDIS_START.read_text()
    example = env_file(DEPLOY / "env.example")
    for role in placeholders:
        assert f"'${{REDIS_ACL_{role}_SHA256}}'/$(sha \"${{REDIS_{role}_PASSWORD:?}}\")" in start, role
        assert f"REDIS_{role}_PASSWORD" in redis["environment"] and f"REDIS_{role}_PASSWORD" in example, role
    assert len(placeholders) == len(users)
    # Kubernetes: the URL of the last Secret that sets one, per the documented Secrets.
    documented = (DEPLOY / "k8s" / "config.yaml").read_text()
    secret_users = {
        name: url_user(url)
        for name, body in re.findall(
            r"kubectl create secret generic ([\w-]+)(.*?)(?=kubectl create|\Z)", documented, re.S
        )
        for url in re.findall(r"CHORDBEAT_BROKER_URL=(\S+)", body)
    }
    for doc in k8s_documents():
        if doc["kind"] != "Deployment":
            continue
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        refs = [s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s]
        user = [secret_users[ref] for ref in refs if ref in secret_users][-1]
        used.add(user)
        assert user == ROLE_USERS[check_command(container["command"])], doc["metadata"]["name"]
    # systemd: the environment files in order, a later one's value winning.
    for name, unit in systemd_units().items():
        env: dict[str, str] = {}
        for path in unit["EnvironmentFile"]:
            env.update(env_file(DEPLOY / "systemd" / Path(path.lstrip("-")).name))
        role = check_command(shlex.split(unit["ExecStart"][0]))
        used.add(user := url_user(env["CHORDBEAT_BROKER_URL"]))
        assert user == ROLE_USERS[role], name
    assert used == users - {SERVICE_USER}


def test_every_process_that_imports_steps_gets_the_task_modules_and_the_operators_image() -> None:
    """Your steps in production (docs/own-steps.md): the workers import CHORDBEAT_TASK_MODULES, beat
    and the dashboard check a schedule's steps against them at apply; every deploy file passes the
    variable to each of them, from one place the operator fills in, and runs one image for all."""
    imports = {"worker", "beat", "web"}
    # compose: from deploy/.env (env.example lists it), in the operator's image if IMAGE names one.
    services: dict[str, Any] = compose()["services"]
    given = set()
    for name, service in services.items():
        if service.get("build") and check_command(service["command"]) in imports:
            assert service["environment"]["CHORDBEAT_TASK_MODULES"] == "${CHORDBEAT_TASK_MODULES:-}", name
            assert service["image"] == "${IMAGE:-chordbeat:latest}", name
            given.add(name)
    assert given == {"worker", "control", "beat-a", "beat-b", "web"}
    assert {"IMAGE", "CHORDBEAT_TASK_MODULES"} <= set(env_file(DEPLOY / "env.example"))
    # Kubernetes: the ConfigMap every such Deployment reads, which all run the same image name (one
    # `kustomize edit set image chordbeat=...` swaps it everywhere).
    assert "CHORDBEAT_TASK_MODULES" in config_map("chordbeat")
    given = set()
    for doc in k8s_documents():
        if doc["kind"] != "Deployment":
            continue
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "chordbeat:latest", doc["metadata"]["name"]
        if check_command(container["command"]) in imports:
            assert {"configMapRef": {"name": "chordbeat"}} in container["envFrom"], doc["metadata"]["name"]
            given.add(doc["metadata"]["name"])
    assert given == {"chordbeat-worker", "chordbeat-control", "chordbeat-beat", "chordbeat-web"}
    # systemd: chordbeat.env, read by each such unit, which runs the venv the package goes into.
    assert "CHORDBEAT_TASK_MODULES" in env_file(DEPLOY / "systemd" / "chordbeat.env")
    given = set()
    for name, unit in systemd_units().items():
        if check_command(shlex.split(unit["ExecStart"][0])) in imports:
            assert "/etc/chordbeat/chordbeat.env" in unit["EnvironmentFile"], name
            assert unit["ExecStart"][0].startswith("/opt/chordbeat/.venv/bin/"), name
            given.add(name)
    assert given == {
        "chordbeat-worker@.service",
        "chordbeat-control.service",
        "chordbeat-beat.service",
        "chordbeat-web.service",
    }
