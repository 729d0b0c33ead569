"""A worker that consumes the control queue and runs steps (``make run``'s single worker, a small
deployment): its main process sends alerts with the channels' URLs and secrets, its prefork
children, which run step code, do not have them in their environment."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from tests.support import processes
from tests.support.helpers import call, finished
from tests.support.receivers import HttpReceiver, http_receiver  # noqa: F401  (a fixture)

CHANNELS_FILE = """\
channels:
  ops-webhook: {kind: webhook, url_env: OPS_WEBHOOK_URL, secret_env: OPS_WEBHOOK_SECRET, insecure: true}
  ops-mail: {kind: email, to: ["ops@example.com"], smtp_url_env: OPS_SMTP_URL}
"""
#: The channels' variables: the file's, and the contract's default mail server.
SECRETS = ("OPS_WEBHOOK_URL", "OPS_WEBHOOK_SECRET", "OPS_SMTP_URL", "CHORDBEAT_SMTP_URL")
#: A variable no channel names: steps keep seeing it (so the step can tell seen from not seen).
ORDINARY = "HR_EXPORT_DIR"


def test_pool_children_running_steps_do_not_see_the_channels_secrets_the_sender_uses(
    app: ChordbeatCelery,
    client: Celery,
    settings: Settings,
    tmp_path: Path,
    http_receiver: HttpReceiver,  # noqa: F811
) -> None:
    channels = tmp_path / "channels.yaml"
    channels.write_text(CHANNELS_FILE)
    settings = dataclasses.replace(settings, task_modules=("tests.support.environment_tasks",))
    env = {
        "CHORDBEAT_ALERT_CHANNELS": str(channels),
        "OPS_WEBHOOK_URL": http_receiver.url,
        "OPS_WEBHOOK_SECRET": "hook-signing-key",
        "OPS_SMTP_URL": "smtp://pager:hunter2@127.0.0.1:9",
        "CHORDBEAT_SMTP_URL": "smtp://127.0.0.1:9",
        ORDINARY: "/srv/hr",
        "PYTHONPATH": processes.ROOT,
    }
    definition = {
        "name": "nightly-hr-sync",
        "every": 3600,
        "steps": [{"name": "look around", "task": "envcheck.visible", "kwargs": {"names": [*SECRETS, ORDINARY]}}],
    }
    # One prefork worker on every queue: it sends alerts and runs steps.
    with processes.worker(settings, tmp_path, concurrency=2, env=env):
        call(client, "chordbeat.apply_schedule", definition=definition)
        seen = []
        for _ in range(2):  # a run in each pool child, as far as the pool spreads them
            run = call(client, "chordbeat.trigger_schedule", name="nightly-hr-sync")["execution_id"]
            execution = finished(client, run)
            assert execution["status"] == "completed", execution
            seen.append(json.loads(execution["activities"][0]["message"]))
        # The main process still sends with them.
        test = call(client, "chordbeat.test_alert", channel="ops-webhook")
        [got] = http_receiver.wait(1)
    assert seen == [{**dict.fromkeys(SECRETS, False), ORDINARY: True}] * 2, seen
    assert got.json()["id"] == test["id"] and got.signature_valid("hook-signing-key")
