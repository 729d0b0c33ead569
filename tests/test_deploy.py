"""Deploy files agree with the real commands and variables (no container engine here to run them)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from celeryapp.cli import main as chordbeat_cli

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
#: Variables read by the settings object, the contract's and chordbeat's own.
KNOWN_VARS = set(re.findall(r'"(CHORDBEAT_[A-Z_]+)"', (ROOT / "celeryapp" / "config.py").read_text()))
#: Deploy-only: tells the image's HEALTHCHECK which liveness file to read.
DEPLOY_VARS = {"CHORDBEAT_ROLE"}
CELERY_ROLES = {"worker", "beat", "flower"}


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


def variables(text: str) -> set[str]:
    return set(re.findall(r"\bCHORDBEAT_[A-Z_]+\b", text))


def test_documented_variables_are_exactly_those_the_settings_read() -> None:
    readme = (ROOT / "README.md").read_text()
    assert {"CHORDBEAT_BROKER_URL", "CHORDBEAT_DATABASE_URL", "CHORDBEAT_HEARTBEAT_TTL"} <= KNOWN_VARS
    for name in KNOWN_VARS:
        assert f"`{name}`" in readme, f"{name} is not documented in README.md"
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            unknown = variables(path.read_text()) - KNOWN_VARS - DEPLOY_VARS
            assert not unknown, f"{path.relative_to(ROOT)} uses unknown variables {unknown}"


def test_compose_services_run_real_commands_with_healthchecks() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services: dict[str, Any] = compose["services"]
    roles = {}
    for name, service in services.items():
        if "command" in service and service.get("build"):
            roles[name] = check_command(service["command"])
        if name != "migrate":
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    assert roles == {
        "migrate": "db upgrade",
        "worker": "worker",
        "beat-a": "beat",
        "beat-b": "beat",
        "flower": "flower",
        "metrics": "metrics",
    }
    assert services["worker"]["healthcheck"]["test"] == ["CMD", "chordbeat", "health", "worker"]
    assert services["beat-a"]["healthcheck"]["test"] == ["CMD", "chordbeat", "health", "beat"]
    redis = services["redis"]["command"]
    assert redis[redis.index("--appendonly") + 1] == "yes"
    assert redis[redis.index("--maxmemory-policy") + 1] == "noeviction"
    assert services["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_kubernetes_manifests_run_real_commands_with_probes() -> None:
    docs = [d for path in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("ConfigMap", "chordbeat"), ("Secret", "chordbeat"), ("Job", "chordbeat-migrate")} <= kinds
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {"chordbeat-worker", "chordbeat-beat", "chordbeat-flower", "chordbeat-metrics"}
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
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        exec_start = next(line for line in unit.read_text().splitlines() if line.startswith("ExecStart="))
        argv = shlex.split(exec_start.removeprefix("ExecStart="))
        roles.add(check_command(argv))
        assert "EnvironmentFile=/etc/chordbeat/chordbeat.env" in unit.read_text()
    assert roles == {"db upgrade", "worker", "beat", "flower", "metrics"}


def test_the_image_runs_as_a_user_and_checks_its_health() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    user = re.search(r"^USER (\S+)", dockerfile, re.M)
    assert user is not None and user.group(1) not in {"root", "0"}
    assert 'CMD chordbeat health "$CHORDBEAT_ROLE"' in dockerfile
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None and check_command(yaml.safe_load(cmd.group(1))) == "worker"
    for copied in re.findall(r"^COPY (\S+)", dockerfile, re.M):
        assert (ROOT / copied).exists(), copied


@pytest.mark.parametrize("argv", [["celery", "-A", "other", "worker"], ["chordbeat", "nope"]])
def test_the_checker_rejects_commands_that_do_not_exist(argv: list[str]) -> None:
    with pytest.raises(AssertionError):
        check_command(argv)
