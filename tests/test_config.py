"""Numeric settings: a value a process cannot run with is refused at start, naming the variable."""

from __future__ import annotations

import pytest

from celeryapp.config import Settings
from celeryapp.errors import ConfigError

NUMERIC = {
    "CHORDBEAT_HEARTBEAT_TTL": ("heartbeat_ttl_s", 1),
    "CHORDBEAT_RECOVERY_INTERVAL": ("recovery_interval_s", 0.5),
    "CHORDBEAT_BEAT_STALL": ("beat_stall_s", 5),
    "CHORDBEAT_RETENTION_DAYS": ("retention_days", 0),
    "CHORDBEAT_RESULT_EXPIRES": ("result_expires_s", 60),
    "CHORDBEAT_ALERT_SEND_TIMEOUT": ("alert_send_timeout_s", 1),
}


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("nan", "expected a finite number, got 'nan'"),
        ("-inf", "expected a finite number, got '-inf'"),
        ("inf", "expected a finite number, got 'inf'"),
        ("1e999", "expected a finite number, got '1e999'"),
        ("true", "expected a number, got 'true'"),
        ("15s", "expected a number, got '15s'"),
        ("-1", "must be at least"),
    ],
)
def test_a_bad_number_is_refused_naming_the_variable(name: str, raw: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: raw})
    assert str(info.value).startswith(f"{name}: {reason}")


@pytest.mark.parametrize("name", NUMERIC)
def test_the_smallest_allowed_value_and_unset_are_taken(name: str) -> None:
    field, minimum = NUMERIC[name]
    assert getattr(Settings.from_env({name: str(minimum)}), field) == minimum
    assert getattr(Settings.from_env({name: ""}), field) == getattr(Settings(), field)


def test_an_alert_send_may_not_outlast_the_senders_claim_on_its_delivery() -> None:
    assert Settings.from_env({"CHORDBEAT_ALERT_SEND_TIMEOUT": "50"}).alert_send_timeout_s == 50
    with pytest.raises(ConfigError, match=r"^CHORDBEAT_ALERT_SEND_TIMEOUT: must be at most 50 .*got '51'$"):
        Settings.from_env({"CHORDBEAT_ALERT_SEND_TIMEOUT": "51"})


def test_just_below_the_minimum_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^CHORDBEAT_BEAT_STALL: must be at least 5, got '4.9'$"):
        Settings.from_env({"CHORDBEAT_BEAT_STALL": "4.9"})


@pytest.mark.parametrize(
    "raw",
    [
        "chordbeat.example.com",
        "javascript:alert(1)",
        "ftp://chordbeat.example.com",
        "https://",
        "https://user:secret@chordbeat.example.com",
        "https://chordbeat.example.com/?next=/x",
        "https://chordbeat.example.com/#top",
        "https://chordbeat.example.com/a b",
        "https://chordbeat.example.com/\r\nX-Injected: 1",
        'https://chordbeat.example.com/"><script>',
        "https://[::1",
        "https://chordbeat.example.com:99999",
    ],
)
def test_a_dashboard_url_that_is_no_plain_web_address_is_refused(raw: str) -> None:
    # Alerts put it in links people click and in emails' HTML.
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"CHORDBEAT_DASHBOARD_URL": raw})
    assert str(info.value).startswith("CHORDBEAT_DASHBOARD_URL: expected the dashboard's http:// or https:// address")
    assert "secret" not in str(info.value)


def test_a_dashboard_url_is_taken_without_its_trailing_slash() -> None:
    url = Settings.from_env({"CHORDBEAT_DASHBOARD_URL": "https://ops.example.com:8443/chordbeat/"}).dashboard_url
    assert url == "https://ops.example.com:8443/chordbeat"
    assert Settings.from_env({"CHORDBEAT_DASHBOARD_URL": ""}).dashboard_url is None


BACKFILL_BOUNDS = {
    "CHORDBEAT_BACKFILL_MAX_PENDING_PER_SCHEDULE": "backfill_max_pending_per_schedule",
    "CHORDBEAT_BACKFILL_MAX_PENDING": "backfill_max_pending",
    "CHORDBEAT_BACKFILL_MAX_STEP_RUNS": "backfill_max_step_runs",
}


@pytest.mark.parametrize("name", BACKFILL_BOUNDS)
@pytest.mark.parametrize("raw", ["0", "-5", "1.5", "1e6", "nan", "many"])
def test_a_backfill_bound_is_a_whole_number_of_at_least_one(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: raw})
    assert str(info.value) == f"{name}: expected a whole number of at least 1, got {raw!r}"


@pytest.mark.parametrize("name", BACKFILL_BOUNDS)
def test_a_backfill_bound_is_read_and_unset_is_the_default(name: str) -> None:
    field = BACKFILL_BOUNDS[name]
    assert getattr(Settings.from_env({name: "7"}), field) == 7
    assert getattr(Settings.from_env({}), field) == getattr(Settings(), field) >= 10_000
