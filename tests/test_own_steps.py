"""docs/own-steps.md as an operator follows it: chordbeat's image extended with a package of one's
own steps. There is no container engine here or in CI, so the Dockerfiles' steps are carried out
in a directory standing for the image's file system, with a virtualenv for its Python; then a real
worker started from that virtualenv runs one of the package's steps for a real schedule run."""

from __future__ import annotations

import re
import shlex
import shutil
import site
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from celery import Celery

from celeryapp.config import Settings
from celeryapp.messaging.redis_client import get_redis
from celeryapp.monitoring.worker_registry import live_workers
from tests.support import processes
from tests.support.helpers import call, finished
from tests.support.processes import Process
from tests.support.servers import wait_for

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "own-steps.md"
README = ROOT / "README.md"


def fenced(text: str, language: str, first_line: str) -> str:
    """The guide's code block in ``language`` whose first line is ``first_line``."""
    found = re.search(rf"```{language}\n({re.escape(first_line)}\n.*?)```", text, re.S)
    assert found, f"docs/own-steps.md shows a {language} block starting {first_line!r}"
    return found.group(1)


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """A Dockerfile's instructions (continued lines joined), comments left out."""
    joined = re.sub(r"\\\n\s*", " ", dockerfile)
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


@dataclass
class Image:
    """An image's file system under ``root``; its Python is the virtualenv at ``venv``."""

    root: Path
    venv: Path
    workdir: Path = field(init=False)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir = self.root

    def path(self, name: str) -> Path:
        return self.root / name.lstrip("/") if name.startswith("/") else self.workdir / name

    def shell_env(self) -> dict[str, str]:
        # pip reaches the index only for setuptools, to build with (as in the image build);
        # chordbeat's dependencies are this test's venv's, the example package has none.
        return {"PATH": f"{self.venv / 'bin'}:/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **self.env}

    def carry_out(self, steps: list[tuple[str, str]], context: Path, run: bool = True) -> list[str]:
        """WORKDIR, COPY, ENV and (with ``run``) RUN as docker build does them; the RUN lines."""
        commands = []
        for instruction, argument in steps:
            if instruction == "WORKDIR":
                self.workdir = self.path(argument)
                self.workdir.mkdir(parents=True, exist_ok=True)
            elif instruction == "COPY":
                *sources, destination = shlex.split(argument)
                target = self.path(destination)
                for source in sources:
                    into = target / source if len(sources) > 1 or destination.endswith("/") else target
                    if (context / source).is_dir():
                        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
                        shutil.copytree(context / source, into, ignore=ignore, dirs_exist_ok=True)
                    else:
                        into.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy(context / source, into)
            elif instruction == "ENV":
                self.env.update(pair.partition("=")[::2] for pair in shlex.split(argument))
            elif instruction == "RUN":
                commands.append(argument)
                if run:
                    done = subprocess.run(
                        ["bash", "-c", argument], cwd=self.workdir, env=self.shell_env(), capture_output=True, text=True
                    )
                    assert done.returncode == 0, f"RUN {argument}\n{done.stdout}\n{done.stderr}"
        return commands


@pytest.fixture
def image(tmp_path: Path) -> Iterator[Image]:
    """chordbeat's image (deploy/Dockerfile) carried out: its COPY steps, then its pip install
    as the wheel of what they copied, installed into a fresh virtualenv whose dependencies are
    those of this test's venv (no download of them)."""
    root = tmp_path / "image"
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    purelib = Path(
        subprocess.check_output(
            [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    (purelib / "dependencies.pth").write_text(site.getsitepackages()[0] + "\n")
    built = Image(root, venv)
    base = instructions((ROOT / "deploy" / "Dockerfile").read_text())
    (install,) = built.carry_out(base, ROOT, run=False)
    assert install.startswith("pip install -c constraints.txt '.[postgres]'"), install
    wheels = tmp_path / "wheels"
    for argv in (["pip", "wheel", "--no-deps", "-w", str(wheels), "."], ["pip", "install", "--no-deps", "WHEEL"]):
        if argv[-1] == "WHEEL":
            (wheel,) = wheels.glob("chordbeat-*.whl")
            argv[-1] = str(wheel)
        done = subprocess.run(
            argv, cwd=built.workdir, env=built.shell_env(), capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout + done.stderr
    yield built


@pytest.mark.timeout(300)
def test_an_image_with_your_steps_runs_them_for_a_schedule(
    image: Image, settings: Settings, client: Celery, tmp_path: Path
) -> None:
    guide = GUIDE.read_text()
    # The package: the README's hr/steps.py, with the guide's pyproject.toml, beside the Dockerfile.
    context = tmp_path / "context"
    package = context / "hr-steps"
    (package / "hr").mkdir(parents=True)
    (package / "pyproject.toml").write_text(fenced(guide, "toml", "# hr-steps/pyproject.toml"))
    (package / "hr" / "__init__.py").write_text("")
    code = re.search(r"```python\n(# hr/steps.py\n.*?)```", README.read_text(), re.S)
    assert code, "the README shows the first step's module"
    (package / "hr" / "steps.py").write_text(code.group(1))
    dockerfile = instructions(
        fenced(guide, "dockerfile", "# Dockerfile, beside hr-steps/: chordbeat's image with your steps installed.")
    )
    assert dockerfile[0] == ("FROM", "chordbeat:latest")
    # chordbeat's user again at the end: the steps' code, like chordbeat's, is root's.
    assert dockerfile[-1] == ("USER", "10001:10001")
    image.carry_out(dockerfile[1:], context)
    assert not (image.workdir / "hr-steps").exists(), "the build context is not left in the image"

    # Both come from the image's site-packages, not from a checkout.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in processes.settings_env(settings).items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=image.shell_env()["PATH"], CHORDBEAT_TASK_MODULES="hr.steps")
    where = subprocess.run(
        [
            image.venv / "bin" / "python",
            "-c",
            "import celeryapp, hr.steps; print(celeryapp.__file__, hr.steps.__file__)",
        ],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(Path(p).is_relative_to(image.venv) for p in where), where

    # In a directory of its own: celery puts its working directory first on sys.path. (python -m:
    # celery's own script is in the venv whose packages stand for the image's dependencies.)
    queues = "chordbeat,chordbeat.control,celery"
    argv = [
        "celery",
        "-A",
        "celeryapp",
        "worker",
        "-l",
        "INFO",
        "-Q",
        queues,
        "-P",
        "threads",
        "-c",
        "2",
        "-n",
        "own@%h",
    ]
    worker = Process(
        ["env", "-C", str(run_dir), str(image.venv / "bin" / "python"), "-m", *argv], env, tmp_path / "w.log"
    )
    try:
        redis_client = get_redis(settings.broker_url)
        wait_for(
            lambda: any("chordbeat" in w.queues for w in live_workers(redis_client)), 90, 0.5, what="the image's worker"
        )
        step = {"name": "HR import", "task": "hr.import_people", "kwargs": {"full": True}}
        definition = {"name": "hr-nightly", "every": 3600, "payload": {"initiator": "hr"}, "steps": [step]}
        call(client, "chordbeat.apply_schedule", definition=definition)
        run = finished(client, call(client, "chordbeat.trigger_schedule", name="hr-nightly")["execution_id"], 60)
        assert run["status"] == "completed", (run, worker.output())
        assert [a["status"] for a in run["activities"]] == ["complete"]
        assert "hr.import_people" in worker.output()
    finally:
        worker.stop()
