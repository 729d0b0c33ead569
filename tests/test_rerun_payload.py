"""A re-run with another payload, from the service, the CLI (in an 80-column terminal) and the
dashboard's form: checked as any payload, kept in the audit row; and a re-run's groups taken from
the run it re-runs show as completed there (with a link), not as "not started"."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from celery import Celery

from celeryapp import app as chordbeat_app
from celeryapp import outcome
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.context import current_step
from celeryapp.domain.limits import MAX_JSON_DEPTH
from celeryapp.interfaces.display import EARLIER_RUN, step_states
from tests.support import processes
from tests.support.helpers import call, finished, step
from tests.support.terminals import in_pty, plain_lines
from tests.support.web_server import ADMIN, WebServer, xsrf

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
SGR = re.compile(r"\x1b\[[0-9;]*m")
#: Deeper than any payload may be (limits.MAX_JSON_DEPTH).
DEEP: Any = 1
for _ in range(MAX_JSON_DEPTH + 1):
    DEEP = [DEEP]


@chordbeat_app.task(name="tests.rerun_needs_a_region")
def needs_a_region() -> dict[str, Any]:
    """Fails for the payload's region "moon" (a run that failed because of its payload)."""
    context = current_step()
    assert context is not None
    if context.payload.get("region") == "moon":
        raise ValueError("no bank on the moon")
    return outcome.completed(f"paid in {context.payload['region']}")


DEFINITION = {
    "name": "payroll",
    "every": 3600,
    "payload": {"region": "moon"},
    "steps": [step("prepare"), {"name": "pay", "task": "tests.rerun_needs_a_region"}, step("after")],
}


def _terminal(settings: Settings, *args: str) -> tuple[int, str]:
    status, output = in_pty([CHORDBEAT, *args], processes.settings_env(settings, TZ="UTC"), columns=80)
    return status, "\n".join(plain_lines(SGR.sub("", output)))


def _last_rerun_row(client: Celery) -> dict[str, Any]:
    row: dict[str, Any] = call(client, "chordbeat.list_audit", schedule="payroll", limit=1)[0]
    assert row["action"] == "rerun", row
    return row


def test_a_rerun_takes_another_payload_and_shows_the_groups_it_reuses(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    call(client, "chordbeat.apply_schedule", definition=DEFINITION)
    source = finished(client, call(client, "chordbeat.trigger_schedule", name="payroll")["execution_id"])
    assert source["status"] == "failed" and source["current_step_index"] == 1, source

    # Refused as any payload is, naming the flag or the field; nothing starts.
    for typed, said in (
        ("{nope", "--payload"),
        ("[1]", "payload: must be an object"),
        (json.dumps({"a": DEEP}), "payload"),
    ):
        status, output = _terminal(settings, "rerun", str(source["id"]), "--from-failed", "--payload", typed)
        assert status != 0 and said in output, output
    assert len(call(client, "chordbeat.list_executions", schedule="payroll")) == 1

    status, output = _terminal(
        settings, "rerun", str(source["id"]), "--from-failed", "--payload", '{"region": "earth"}', "--reason", "moved"
    )
    assert status == 0 and 'from group 2 with payload {"region": "earth"}' in output, output
    rerun_id = int(re.search(r"execution (\d+) started: re-run of", output)[1])  # type: ignore[index]
    rerun = finished(client, rerun_id)
    assert rerun["status"] == "completed" and rerun["payload"] == {"region": "earth"}, rerun
    assert rerun["groups"] == [["prepare"], ["pay"], ["after"]]
    assert _last_rerun_row(client)["detail"] == {
        "rerun_of": source["id"],
        "from_group": 1,
        "version": 1,
        "payload": {"region": "earth"},
        "claimed_source": "cli",
    }

    # The CLI's view of the re-run: group 1 completed in the earlier run, not missing.
    status, shown = _terminal(settings, "execution", str(rerun_id))
    assert status == 0, shown
    assert re.search(r"^\s*1\s+prepare\s+completed earlier\s", shown, re.M), shown
    assert f"re-run of execution {source['id']} from group 2" in shown

    with WebServer(app) as web:
        admin = web.session(ADMIN)
        page = admin.get(f"{web.url}/execution/{rerun_id}", timeout=10).text
        line = re.search(r'<div class="grow" id="step-prepare">.*?</div>\s*<div class="gtrack">', page, re.S)
        assert line, page
        assert "completed earlier" in line[0] and f'href="/execution/{source["id"]}"' in line[0], line[0]
        assert "not started" not in line[0], line[0]
        # The form: the run's own payload filled in, to change.
        form = admin.get(f"{web.url}/act/rerun/{source['id']}", timeout=10).text
        assert "&quot;region&quot;: &quot;moon&quot;" in form and "run #" in form, form
        data = {"_xsrf": xsrf(admin), "reason": "try mars", "payload": "[1]"}
        refused = admin.post(f"{web.url}/act/rerun/{source['id']}", data=data, timeout=10)
        assert refused.status_code == 400 and "must be a JSON object" in refused.text
        data["payload"] = '{"region": "mars"}'
        admin.post(f"{web.url}/act/rerun/{source['id']}", data=data, timeout=10)
        row = _last_rerun_row(client)
        assert row["detail"]["payload"] == {"region": "mars"} and row["source"] == "web", row
        assert finished(client, row["execution_id"])["payload"] == {"region": "mars"}
        # Sent as filled in: the run's own payload, and no change recorded.
        data["payload"] = '{\n  "region": "moon"\n}'
        admin.post(f"{web.url}/act/rerun/{source['id']}", data=data, timeout=10)
        row = _last_rerun_row(client)
        assert "payload" not in row["detail"], row
        assert finished(client, row["execution_id"])["payload"] == {"region": "moon"}


def test_steps_of_a_group_are_listed_in_the_definitions_order() -> None:
    """As they ended (zeta last started, first done) is not as they are defined."""
    execution = {
        "groups": [["load"], ["zeta", "alpha", "mid"]],
        "rerun_of": None,
        "activities": [
            {"step_index": 0, "step": "load", "status": "complete", "attempt": 1},
            {"step_index": 1, "step": "mid", "status": "complete", "attempt": 1},
            {"step_index": 1, "step": "alpha", "status": "complete", "attempt": 1},
        ],
        "tasks": [{"step_index": 1, "step": "zeta", "status": "processing", "attempt": 1}],
    }
    assert [step for _, step in step_states(execution)] == ["load", "zeta", "alpha", "mid"]
    reused = {**execution, "rerun_of": 4, "rerun_from_group": 1, "activities": [], "tasks": []}
    assert step_states(reused) == {(0, "load"): (EARLIER_RUN, 0)}
