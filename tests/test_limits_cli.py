"""``chordbeat limits`` as a person at an 80-column terminal uses it, against a real worker: the
list with what is held and who waits, ``show`` with holders, waiters and keys, ``set`` after a
question and audited, refusals naming the field, a "did you mean", and ``delete`` refused while
held unless forced. Every output ends with a newline."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.execution.limit_slots import Demand, Holder, acquire_or_wait
from models import AuditEvent, transaction
from tests.support import processes
from tests.support.helpers import call, step
from tests.support.terminals import STYLE, in_pty, plain_lines, wide_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
VIEWER = {"TZ": "UTC", "CHORDBEAT_ACTOR": "alice"}
EXPORT = step("export", uses=["erp"])


def chordbeat(settings: Settings, *args: str, replies: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """The real ``chordbeat`` in an 80-column terminal: exit status and the lines seen (the output
    must end with a newline, as every command's does)."""
    env = processes.settings_env(settings, TERM="xterm-256color", **VIEWER)
    status, output = in_pty([CHORDBEAT, *args], env, columns=80, replies=replies)
    shown = STYLE.sub("", output).replace("\r", "")
    assert shown.endswith("\n"), (args, repr(output[-200:]))
    lines = plain_lines(shown)
    assert not wide_lines(lines), "\n".join(lines)
    return status, lines


def occupy(settings: Settings, limit: str, holder: Holder, key: str = "") -> bool:
    with transaction(settings.database_url) as session:
        return acquire_or_wait(session, [Demand(limit, key)], holder)[0]


@pytest.mark.timeout(120)
def test_limits_list_show_set_and_delete_at_an_80_column_terminal(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    status, lines = chordbeat(settings, "limits")
    assert status == 0 and any("no limits" in line for line in lines), lines

    args = ("limits", "set", "erp", "--slots", "1", "--reason", "one export at a time")
    status, lines = chordbeat(settings, *args, replies={"[y/N]": "n\n"})
    assert status == 1 and any("create limit erp: slots 1?" in line for line in lines), lines
    status, lines = chordbeat(settings, *args, replies={"[y/N]": "y\n"})
    assert status == 0 and "erp: created; 0/1 in use" in lines, lines
    status, lines = chordbeat(
        settings,
        *("limits", "set", "warehouse", "--slots", "3", "--rate", "60/min"),
        *("--key", "{payload.customer}", "--per-key-slots", "2", "--max-wait", "600", "--yes"),
    )
    assert status == 0, lines

    assert occupy(settings, "erp", Holder(11, 1, 17, "export stock"))
    assert not occupy(settings, "erp", Holder(12, 1, 19, "export orders"))
    assert occupy(settings, "warehouse", Holder(13, 1, 21, "load ledger"), key="acme")
    status, lines = chordbeat(settings, "limits")
    text = "\n".join(lines)
    assert status == 0, text
    assert re.search(r"erp\s+1/1\s+1\s+-\s+-\s+([\d.]+ s|now)", text), text
    assert re.search(r"warehouse\s+1/3\s+0\s+60/min\s+\{payload\.customer\}\s+-", text), text

    status, lines = chordbeat(settings, "limits", "show", "erp")
    text = "\n".join(lines)
    assert status == 0 and "erp: 1/1 in use, 1 waiting" in text, text
    holders, waiters = text.index("holders"), text.index("waiters")
    assert re.search(r"17\s+export stock\s+-\s+1\s+[\d.]+ s", text[holders:waiters]), text
    assert re.search(r"19\s+export orders\s+-\s+1\s+[\d.]+ s", text[waiters:]), text
    status, lines = chordbeat(settings, "limits", "show", "warehouse")
    text = "\n".join(lines)
    assert "key {payload.customer}, 2 per key" in text and re.search(r"acme\s+1", text), text

    # A step waiting for the limit says, where its run is shown, what it waits for and who holds it.
    call(client, "chordbeat.apply_schedule", definition={"name": "exports", "every": 3600, "steps": [EXPORT]})
    waiting = call(client, "chordbeat.trigger_schedule", name="exports")["execution_id"]
    status, lines = chordbeat(settings, "execution", str(waiting))
    text = "\n".join(lines)
    assert status == 0 and re.search(r"1\s+export\s+waiting for limit\s+1", text), text
    assert "group 1 export (try 1): waiting for erp 1/1 (held by #17 export stock)" in lines, text

    # Mistakes are refused naming the option or the field; nothing changes.
    for args, said in (
        (("--slots", "0"), "Error: slots: must be between 1 and 10000, got 0"),
        (("--slots", "nan"), "Invalid value for '--slots': 'nan' is not a valid integer"),
        (("--rate", "lots"), "Error: rate: must be written N/period"),
        (("--max-wait", "nan"), "Error: max_wait:"),
    ):
        status, lines = chordbeat(settings, "limits", "set", "warehouse", *args, "--yes")
        assert status in (1, 2) and any(said in line for line in lines), (args, lines)
    status, lines = chordbeat(settings, "limits", "show", "warehous")
    assert status == 1 and any("did you mean 'warehouse'?" in line for line in lines), lines

    status, lines = chordbeat(settings, "limits", "set", "warehouse", "--slots", "5", "--as", "bob", "--yes")
    assert status == 0 and "warehouse: changed; 1/5 in use" in lines, lines
    status, lines = chordbeat(settings, "limits", "set", "warehouse", "--slots", "5", "--yes")
    assert status == 0 and any("unchanged" in line for line in lines), lines

    status, lines = chordbeat(settings, "limits", "delete", "erp", "--yes")
    assert status == 1 and any("erp is held (1 slots in use)" in line for line in lines), lines
    status, lines = chordbeat(settings, "limits", "delete", "erp", "--force", "--reason", "retired", "--yes")
    assert status == 0 and "erp: deleted" in lines, lines

    env = processes.settings_env(settings, **VIEWER)
    listed = subprocess.run([CHORDBEAT, "limits", "--json"], env=env, capture_output=True, text=True, check=True)
    assert [(row["name"], row["slots"], row["in_use"]) for row in json.loads(listed.stdout)] == [("warehouse", 5, 1)]
    with transaction(settings.database_url) as session:
        rows = session.scalars(select(AuditEvent).order_by(AuditEvent.id)).all()
        limits = [r for r in rows if r.action.value.startswith("limit_")]
        assert [(r.action.value, r.actor, r.reason, (r.detail or {}).get("limit")) for r in limits] == [
            ("limit_applied", "alice", "one export at a time", "erp"),
            ("limit_applied", "alice", None, "warehouse"),
            ("limit_applied", "bob", None, "warehouse"),
            ("limit_deleted", "alice", "retired", "erp"),
        ]
