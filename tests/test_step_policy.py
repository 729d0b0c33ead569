"""The step policy's pure rules and the settings behind them (no Redis, no worker)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from celeryapp.config import Settings
from celeryapp.domain.definition import StepKind
from celeryapp.domain.step_policy import (
    StepRules,
    env_name_refusal,
    executable_refusal,
    sql_env_refusal,
    step_task_refusal,
)
from celeryapp.errors import ConfigError

SH = os.path.realpath("/bin/sh")


@pytest.mark.parametrize(
    ("task", "patterns", "reason"),
    [
        ("celery.starmap", ("*",), "Celery's own tasks"),
        ("celery.chord_unlock", ("*",), "Celery's own tasks"),
        ("chordbeat.recover", ("*",), "chordbeat's own tasks"),
        ("chordbeat.apply_schedule", ("chordbeat.*",), "chordbeat's own tasks"),
        ("chordbeat.steps.executable", ("*",), "chordbeat's own tasks"),
        ("chordbeat.run_step", ("*",), "chordbeat's own tasks"),
        ("chordbeat.examples.sleep", ("hr.*", "billing.*"), "CHORDBEAT_STEP_TASKS: hr.*,billing.*"),
        ("hr", ("hr.*",), "not allowed as a step"),
        ("HR.export", ("hr.*",), "not allowed as a step"),
    ],
)
def test_reserved_and_unmatched_tasks_are_refused(task: str, patterns: tuple[str, ...], reason: str) -> None:
    refusal = step_task_refusal(task, patterns)
    assert refusal is not None and reason in refusal


@pytest.mark.parametrize(
    ("task", "patterns"),
    [
        ("chordbeat.examples.sleep", ("*",)),
        ("hr.export", ("hr.*", "billing.*")),
        ("billing.close_month", ("hr.*", "billing.*")),
        ("reports.daily", ("reports.dai?y",)),
    ],
)
def test_step_tasks_matching_the_patterns_are_allowed(task: str, patterns: tuple[str, ...]) -> None:
    assert step_task_refusal(task, patterns) is None


def test_programs_are_resolved_before_the_allowlist_is_checked(tmp_path: Path) -> None:
    allowed = tmp_path / "opt" / "hr"
    allowed.mkdir(parents=True)
    export = allowed / "export"
    export.write_text("#!/bin/sh\n")
    (allowed / "shell").symlink_to("/bin/sh")
    (tmp_path / "link-to-hr").symlink_to(allowed)
    allow = (f"{allowed}/", "/usr/bin/env")

    assert executable_refusal(str(export), allow) is None
    # Through a symlinked directory that lands inside the allowlist: the real file counts.
    assert executable_refusal(str(tmp_path / "link-to-hr" / "export"), allow) is None
    assert executable_refusal("/usr/bin/env", allow) is None
    for escape in (f"{allowed}/../../../../bin/sh", f"{allowed}/shell", f"{allowed}/../hr-other/x"):
        refusal = executable_refusal(escape, allow)
        assert refusal is not None and "not in CHORDBEAT_EXECUTABLE_ALLOW" in refusal, escape
    # A directory entry does not allow a sibling whose name merely starts the same way.
    assert executable_refusal(f"{allowed}-evil/x", allow) is not None
    # The directory itself is no program.
    assert executable_refusal(str(allowed), allow) is not None


def test_a_file_entry_allows_that_file_only_and_matches_through_links(tmp_path: Path) -> None:
    link = tmp_path / "sh"
    link.symlink_to("/bin/sh")
    assert executable_refusal("/bin/sh", (str(link),)) is None
    assert executable_refusal(SH, ("/bin/sh",)) is None
    assert executable_refusal("/bin/ls", ("/bin/sh",)) is not None


@pytest.mark.parametrize(
    ("program", "allow", "reason"),
    [
        ("sh", ("/",), "must be an absolute path"),
        ("./export", ("/",), "must be an absolute path"),
        ("/bin/sh\0", ("/",), "NUL"),
        ("/bin/sh", (), "not in CHORDBEAT_EXECUTABLE_ALLOW"),
    ],
)
def test_relative_programs_and_an_empty_allowlist_allow_nothing(
    program: str, allow: tuple[str, ...], reason: str
) -> None:
    refusal = executable_refusal(program, allow)
    assert refusal is not None and reason in refusal


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "ld_preload",
        "LD_AUDIT",
        "PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "BASH_ENV",
        "ENV",
        "IFS",
        "PERL5LIB",
        "PERL5OPT",
        "RUBYLIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "GIT_SSH_COMMAND",
        "JAVA_TOOL_OPTIONS",
        "OPENSSL_CONF",
        "MALLOC_TRACE",
        "DYLD_INSERT_LIBRARIES",
        "BASH_FUNC_x",
        "HTTPS_PROXY",
        "https_proxy",
        "Http_Proxy",
        "ALL_PROXY",
        "no_proxy",
        "SSL_CERT_FILE",
        "SSH_ASKPASS",
        "GIT_ASKPASS",
        "SUDO_ASKPASS",
        "PAGER",
        "EDITOR",
        "VISUAL",
        "BROWSER",
        "SHELL",
        "LESSOPEN",
        "ZDOTDIR",
        "XDG_CONFIG_HOME",
        "PYTHONSTARTUP",
        "PIP_INDEX_URL",
        "PHPRC",
        "LD_PRELOAD ",
        "LD_PREL\u041eAD",
        "\uff2cD_PRELOAD",
        "LD_PRELOAD\n",
        "bad-name",
        "A=B",
        "",
    ],
)
def test_loader_shell_and_interpreter_variables_are_refused(name: str) -> None:
    assert env_name_refusal(name) is not None


@pytest.mark.parametrize("name", ["MODE", "HOME", "LANG", "LC_ALL", "TZ", "HR_EXPORT_DIR", "_X"])
def test_ordinary_variables_are_allowed(name: str) -> None:
    assert env_name_refusal(name) is None


@pytest.mark.parametrize(
    ("name", "prefix", "reason"),
    [
        ("CHORDBEAT_DATABASE_URL", "CHORDBEAT_SQL_", "the worker's own settings"),
        ("CHORDBEAT_DATABASE_URL", None, "the worker's own settings"),
        ("CHORDBEAT_BROKER_URL", "CHORDBEAT_", "the worker's own settings"),
        ("CHORDBEAT_SQL_ENV_PREFIX", "CHORDBEAT_SQL_", "the worker's own settings"),
        ("FLOWER_BASIC_AUTH", "FLOWER_", "the worker's own settings"),
        ("REPORTING_DB", "CHORDBEAT_SQL_", "does not start with CHORDBEAT_SQL_"),
        ("CHORDBEAT_SQL_", "CHORDBEAT_SQL_", "does not start with"),
        ("postgres://u:p@h/db", "CHORDBEAT_SQL_", "must name an environment variable"),
    ],
)
def test_sql_steps_read_only_the_variables_set_aside_for_them(name: str, prefix: str | None, reason: str) -> None:
    refusal = sql_env_refusal(name, prefix)
    assert refusal is not None and reason in refusal


def test_sql_variables_under_the_prefix_are_allowed() -> None:
    assert sql_env_refusal("CHORDBEAT_SQL_REPORTING", "CHORDBEAT_SQL_") is None
    assert sql_env_refusal("REPORTING_DB", "REPORTING_") is None


def test_rules_combine_the_settings_with_what_is_registered() -> None:
    rules = StepRules.of(Settings(step_tasks=("hr.*",)), registered={"hr.export", "celery.starmap"}.__contains__)
    assert rules.task_refusal("hr.export") is None and rules.task_refusal("celery.starmap")
    assert "not registered" in (rules.task_refusal("hr.missing") or "")
    assert "not enabled" in (rules.spec_refusal(StepKind.EXECUTABLE, "chordbeat.steps.executable") or "")
    assert rules.spec_refusal(StepKind.TASK, "hr.export") is None


def test_rules_without_policy_keep_what_holds_whatever_the_settings() -> None:
    rules = StepRules.without_policy()
    assert rules.spec_refusal(StepKind.EXECUTABLE, "chordbeat.steps.executable") is None
    assert rules.spec_refusal(StepKind.SQL, "chordbeat.steps.sql") is None
    assert rules.executable_refusal("/any/program") is None and rules.sql_env_refusal("REPORTS_URL") is None
    assert "absolute path" in (rules.executable_refusal("bin/sh") or "")
    assert "Celery's own tasks" in (rules.task_refusal("celery.starmap") or "")
    assert "worker's own settings" in (rules.sql_env_refusal("CHORDBEAT_DATABASE_URL") or "")
    assert rules.task_refusal("anything.at.all") is None
    known = StepRules.without_policy({"hr.export"}.__contains__)
    assert known.task_refusal("hr.export") is None and "not registered" in (known.task_refusal("hr.missing") or "")


# --- settings -----------------------------------------------------------------------------------


def test_executable_and_sql_steps_are_off_by_default() -> None:
    for settings in (Settings(), Settings.from_env({})):
        assert settings.step_kinds == {"task"}
        assert settings.executable_allow == () and settings.step_tasks == ("*",)
        assert settings.sql_env_prefix == "CHORDBEAT_SQL_" and dict(settings.sql_urls) == {}


def test_step_settings_are_read_from_the_environment() -> None:
    settings = Settings.from_env(
        {
            "CHORDBEAT_STEP_KINDS": "task, executable,sql",
            "CHORDBEAT_EXECUTABLE_ALLOW": "/opt/hr/, /usr/bin/env",
            "CHORDBEAT_STEP_TASKS": "hr.*, billing.*",
            "CHORDBEAT_SQL_REPORTING": "postgresql://reports@db/reports",
            "CHORDBEAT_SQL_EMPTY": "",
            "CHORDBEAT_DATABASE_URL": "postgresql://chordbeat:secret@db/chordbeat",
            "FLOWER_BASIC_AUTH": "admin:secret",
            "REPORTING_DB": "postgresql://other",
        }
    )
    assert settings.step_kinds == {"task", "executable", "sql"}
    assert settings.executable_allow == ("/opt/hr/", "/usr/bin/env")
    assert settings.step_tasks == ("hr.*", "billing.*")
    assert dict(settings.sql_urls) == {"CHORDBEAT_SQL_REPORTING": "postgresql://reports@db/reports"}
    assert "reports@db" not in repr(settings)
    other = Settings.from_env({"CHORDBEAT_SQL_ENV_PREFIX": "REPORTS_", "REPORTS_DAILY": "sqlite://"})
    assert dict(other.sql_urls) == {"REPORTS_DAILY": "sqlite://"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CHORDBEAT_STEP_KINDS": "task,shell"}, "CHORDBEAT_STEP_KINDS"),
        ({"CHORDBEAT_STEP_KINDS": "executable"}, "CHORDBEAT_STEP_KINDS"),
        ({"CHORDBEAT_STEP_KINDS": "task,executable"}, "CHORDBEAT_EXECUTABLE_ALLOW: executable steps are enabled"),
        ({"CHORDBEAT_EXECUTABLE_ALLOW": "bin/export"}, "CHORDBEAT_EXECUTABLE_ALLOW: 'bin/export' is not an absolute"),
        ({"CHORDBEAT_STEP_TASKS": " , "}, "CHORDBEAT_STEP_TASKS"),
        ({"CHORDBEAT_SQL_ENV_PREFIX": "CHORDBEAT_"}, "would let sql steps read the worker's own settings"),
        ({"CHORDBEAT_SQL_ENV_PREFIX": "CHORDBEAT_D"}, "would let sql steps read the worker's own settings"),
        ({"CHORDBEAT_SQL_ENV_PREFIX": "FLOWER_"}, "would let sql steps read the worker's own settings"),
        ({"CHORDBEAT_SQL_ENV_PREFIX": "F"}, "would let sql steps read the worker's own settings"),
        ({"CHORDBEAT_SQL_ENV_PREFIX": "REPORT-"}, "is not the start of a variable name"),
    ],
)
def test_unusable_step_settings_are_refused_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        Settings.from_env(env)
