"""The dashboard's pure parts: words for cadences, times as the CLI writes them, accounts and passwords."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celeryapp.config import Settings
from celeryapp.domain.cadence import next_fire_times
from celeryapp.domain.times import span
from celeryapp.errors import ConfigError
from celeryapp.interfaces.time_words import clock, relative
from celeryapp.interfaces.web.auth import (
    Role,
    check_auth_config,
    check_password,
    dummy_password,
    hash_password,
    parse_users,
)
from celeryapp.interfaces.web.guard import FAILED_LOGIN_FLOOR_S, failure_pad_s
from celeryapp.interfaces.web.humanize import cadence_words, cron_words
from celeryapp.interfaces.web.redirects import same_site_path
from celeryapp.interfaces.web.sessions import client_address, forwarded_https
from celeryapp.interfaces.web.throttle import IPV6_CLIENT_PREFIX, address_scope
from models import Schedule, ScheduleStatus


@pytest.mark.parametrize(
    ("cron", "words"),
    [
        ("0 2 * * *", "02:00 every day"),
        ("30 7 * * 1-5", "07:30 on Mon to Fri"),
        ("0 9 * * 1,3", "09:00 on Mon, Wed"),
        ("*/15 * * * *", "every 15 min"),
        ("5 * * * *", "hourly at :05"),
        ("0 */6 * * *", "every 6 h at :00"),
        ("* * * * *", "every minute"),
        # Without a short form: cron_words.describe's words (were "cron 0 2 1 * *" before issue 27).
        ("0 2 1 * *", "at 02:00 on the 1st of the month"),
        ("0 2-4 * * *", "every hour from 02:00 to 04:00"),
        ("0 18 LW * *", "at 18:00 on the last weekday of the month"),
        ("0 9 * * 1#2", "at 09:00 on the second Monday of the month"),
        ("0 0 1#2 * *", "cron 0 0 1#2 * *"),  # an invalid one (never stored) is quoted
    ],
)
def test_cron_in_words(cron: str, words: str) -> None:
    assert cron_words(cron) == words


def test_cadence_durations_and_relative_times() -> None:
    assert cadence_words("0 2 * * *", None, "Europe/London") == "02:00 every day, Europe/London"
    assert cadence_words(None, 300, "UTC") == "every 5 min"
    assert span(5 * 3600 + 12 * 60 + 7) == "5 h 12 min"
    assert span(3 * 86400 + 4 * 3600) == "3 d 4 h"
    assert span(0.25) == "0.2 s"
    now = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    assert relative(datetime(2026, 11, 22, 15, 12, tzinfo=UTC), now) == "in 5 h 12 min"
    assert relative(datetime(2026, 11, 22, 9, 57, tzinfo=UTC), now) == "3 min ago"
    assert clock(datetime(2026, 7, 1, 1, 0, tzinfo=UTC), "Europe/London") == "2026-07-01 02:00:00 +01:00 BST"


def test_next_ten_fire_times_cross_dst_with_their_offsets() -> None:
    schedule = Schedule(
        name="n",
        cron="0 2 * * *",
        every_s=None,
        timezone="Europe/London",
        status=ScheduleStatus.ACTIVE,
        next_run_at=datetime(2026, 10, 20, 1, 0, tzinfo=UTC),
        retry_at=None,
    )
    times = next_fire_times(schedule, datetime(2026, 10, 19, tzinfo=UTC), 10)
    assert len(times) == 10
    shown = [clock(t, "Europe/London") for t in times]
    assert shown[0] == "2026-10-20 02:00:00 +01:00 BST"
    assert "2026-10-26 02:00:00 +00:00 GMT" in shown
    assert all(s.startswith(f"2026-10-{20 + i} 02:00:00") for i, s in enumerate(shown))


def test_a_paused_schedule_shows_when_it_would_fire() -> None:
    schedule = Schedule(
        name="n",
        cron=None,
        every_s=60.0,
        timezone="UTC",
        status=ScheduleStatus.PAUSED,
        next_run_at=None,
        retry_at=None,
        updated_at=datetime(2026, 1, 1, tzinfo=UTC),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    times = next_fire_times(schedule, datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC), 10)
    assert [t.second for t in times[:2]] == [0, 0] and len(times) == 10


def test_users_parse_with_roles_and_both_password_forms() -> None:
    hashed = hash_password("s3cret:with,colon", iterations=1000)
    users = parse_users(f"ops:admin:{hashed}, watcher:viewer:plain-pass:with:colons")
    assert users["ops"].role is Role.ADMIN and users["ops"].may_act
    # Hashed, a password may hold any character (commas included): only the hash is in the list.
    assert users["ops"].check("s3cret:with,colon")
    assert check_password(hash_password("s3cret", iterations=1000), "s3cret")
    assert not check_password(hash_password("s3cret", iterations=1000), "S3cret")
    assert users["watcher"].check("plain-pass:with:colons") and not users["watcher"].may_act


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("ops:root:pw", "role must be admin or viewer"),
        ("ops:admin", "expected name:role:password"),
        ("ops:admin:a,ops:viewer:b", "appears twice"),
    ],
)
def test_bad_user_entries_are_refused_by_name(raw: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as info:
        parse_users(raw)
    assert "CHORDBEAT_WEB_USERS entry" in str(info.value)


def test_the_dashboard_refuses_to_start_without_accounts_or_secret() -> None:
    with pytest.raises(ConfigError, match="no accounts"):
        check_auth_config("", "x" * 40)
    with pytest.raises(ConfigError, match="CHORDBEAT_WEB_SECRET"):
        check_auth_config("ops:admin:pw", "short")
    assert set(check_auth_config("ops:admin:pw", "x" * 40)) == {"ops"}


def test_the_trusted_proxy_setting_takes_addresses_and_networks_and_names_itself_when_wrong() -> None:
    env = {"CHORDBEAT_WEB_TRUSTED_PROXY": "10.0.0.5, 10.1.0.0/24,::1"}
    assert Settings.from_env(env).web_trusted_proxies == ("10.0.0.5/32", "10.1.0.0/24", "::1/128")
    assert Settings.from_env({}).web_trusted_proxies == ()
    for bad in ("proxy.example", "10.0.0.0/33", "10.0.0.5/24"):
        with pytest.raises(ConfigError, match="CHORDBEAT_WEB_TRUSTED_PROXY"):
            Settings.from_env({"CHORDBEAT_WEB_TRUSTED_PROXY": bad})


def test_a_failed_login_is_padded_to_the_floor_from_the_request_start_not_on_top() -> None:
    assert failure_pad_s(0.18) == pytest.approx(FAILED_LOGIN_FLOOR_S - 0.18)
    assert failure_pad_s(0.0) == FAILED_LOGIN_FLOOR_S
    # A slow check (a busy pool) is not padded further: the floor is a floor, not a delay.
    assert failure_pad_s(FAILED_LOGIN_FLOOR_S + 0.5) == 0.0
    for elapsed in (0.0, 0.001, 0.18, 0.5, 0.999):
        assert elapsed + failure_pad_s(elapsed, 1.0) == pytest.approx(1.0)


def test_unknown_names_are_checked_against_a_dummy_as_dear_as_the_dearest_account() -> None:
    users = parse_users(f"a:admin:{hash_password('x', iterations=1000)},b:viewer:{hash_password('y', iterations=3000)}")
    dummy = dummy_password(users)
    scheme, iterations, _, _ = dummy.split(":")
    assert (scheme, int(iterations)) == ("pbkdf2_sha256", 3000)
    assert not check_password(dummy, "") and not check_password(dummy, "x")
    assert dummy != dummy_password(users)  # nobody can know it
    plain = dummy_password(parse_users("c:admin:plain-password"))
    assert ":" not in plain and not check_password(plain, "plain-password")


def test_forwarded_headers_are_believed_from_the_trusted_proxy_only() -> None:
    proxies = (ipaddress.ip_network("10.0.0.5/32"), ipaddress.ip_network("fd00::/8"))
    assert forwarded_https("10.0.0.5", "http", "https", proxies)
    assert forwarded_https("fd00::1", "http", "http, https", proxies)  # the proxy's own, last
    assert not forwarded_https("10.0.0.6", "http", "https", proxies)
    assert not forwarded_https("10.0.0.5", "http", "https, http", proxies)
    assert not forwarded_https("10.0.0.5", "http", None, proxies)
    assert forwarded_https("10.0.0.6", "https", None, proxies)  # its own TLS
    assert client_address("10.0.0.5", "6.6.6.6, 192.0.2.7", proxies) == "192.0.2.7"
    assert client_address("10.0.0.6", "192.0.2.7", proxies) == "10.0.0.6"
    assert client_address("10.0.0.5", "not-an-address", proxies) == "10.0.0.5"
    assert client_address("10.0.0.5", None, proxies) == "10.0.0.5"


#: Each read by the WHATWG URL parser against http://dash.example/act/pause as the host
#: evil.example (checked with node's ``new URL``): tab and newlines dropped, backslash a slash,
#: C0 controls and spaces stripped from the ends, a scheme with a host.
ANOTHER_SITE = [
    "//evil.example",
    "/\t/evil.example",
    "/\n/evil.example",
    "/\r/evil.example",
    "\t//evil.example",
    "/\t\\evil.example",
    "/\\\tevil.example",
    "/\\evil.example",
    "\\/evil.example",
    "\\\\evil.example",
    " //evil.example",
    "\x00//evil.example",
    "\x1f/\\evil.example",
    "https:evil.example",
    "http:\\\\evil.example",
    "https://evil.example/",
    "javascript:alert(1)",
]


@pytest.mark.parametrize("target", ANOTHER_SITE)
def test_a_next_a_browser_reads_as_another_site_is_refused(target: str) -> None:
    assert same_site_path(target) == "/"
    assert same_site_path(target, "/alerts") == "/alerts"


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/schedule?name=a%2F%2Fb", "/schedule?name=a%2F%2Fb"),
        ("/alerts?status=open&schedule=", "/alerts?status=open&schedule="),
        ("/%09/evil.example", "/%09/evil.example"),  # a path of this site: browsers do not decode it
        (" /health\n", "/health"),  # as the browser will read it
        ("/.//evil.example", "/.//evil.example"),  # http://dash.example//evil.example
    ],
)
def test_a_next_of_this_site_is_kept_as_the_browser_reads_it(target: str, path: str) -> None:
    assert same_site_path(target) == path


def test_a_control_character_inside_a_next_is_refused() -> None:
    # Harmless to a browser (percent-encoded in the path) but not for a Location header.
    assert same_site_path("/\x0b/x") == "/" and same_site_path("/\x7f/x") == "/"


_IPV4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
_IPV6 = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address).filter(lambda a: a.ipv4_mapped is None)


@given(_IPV4)
def test_an_ipv4_client_is_counted_by_its_address_also_when_mapped_into_ipv6(address: ipaddress.IPv4Address) -> None:
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    assert address_scope(str(address)) == address_scope(str(mapped)) == str(address)


@given(_IPV6, _IPV6)
def test_ipv6_clients_share_a_count_exactly_when_they_share_a_64_prefix(
    one: ipaddress.IPv6Address, other: ipaddress.IPv6Address
) -> None:
    """Before: keyed by the full address, so the 2**64 addresses of one /64 had 2**64 counts."""
    scope = address_scope(str(one))
    assert one in ipaddress.IPv6Network(scope) and ipaddress.IPv6Network(scope).prefixlen == IPV6_CLIENT_PREFIX
    assert (scope == address_scope(str(other))) == (int(one) >> 64 == int(other) >> 64)
    assert address_scope(one.exploded.upper()) == scope  # however it is spelt
    assert address_scope(f"{one}%eth0") == scope


@given(st.text(max_size=30).filter(lambda t: not _is_address(t.split("%", 1)[0])))
def test_what_is_no_address_is_counted_as_given(text: str) -> None:
    assert address_scope(text) == text


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
