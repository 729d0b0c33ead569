"""Redis URLs and Sentinel lists: what every client gets from them, what is refused at start-up
(naming the variable, never quoting the password) and what ``celery inspect conf`` shows."""

from __future__ import annotations

import pytest
import redis
from celery.app.utils import filter_hidden_settings

from celeryapp.application import celery_config
from celeryapp.config import Settings
from celeryapp.errors import ConfigError
from celeryapp.messaging.broker import SENTINEL_TRANSPORT, TRANSPORT
from celeryapp.messaging.redis_client import UnusableRedisUrl, get_redis, reset_clients
from celeryapp.redis_urls import Sentinels, parse_sentinels

PASSWORD = "sentinel-pw-81c3"
LIST = f"sentinel://:{PASSWORD}@10.0.0.1:26379/2;sentinel://10.0.0.2:26380;sentinel://[::1]:26381/2"
URL_VARIABLES = ("CHORDBEAT_BROKER_URL", "CHORDBEAT_RESULT_BACKEND", "CHORDBEAT_REDBEAT_URL")


def test_a_sentinel_list_gives_every_sentinel_and_the_first_entrys_database_and_password() -> None:
    assert parse_sentinels(LIST) == Sentinels(
        (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 26381)), db=2, username=None, password=PASSWORD
    )
    assert parse_sentinels("sentinel://ops:p%40ss@h:1").password == "p@ss"
    assert parse_sentinels("sentinel://ops:p%40ss@h:1").username == "ops"


@pytest.mark.parametrize("variable", URL_VARIABLES)
@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("sentinel://:1", "entry 1 of the Sentinel list has no host"),
        ("sentinel://h", "entry 1 of the Sentinel list has no port"),
        ("sentinel://h:99999", "entry 1 of the Sentinel list: the port is not a number from 1 to 65535"),
        ("sentinel://h:x", "entry 1 of the Sentinel list: the port is not a number from 1 to 65535"),
        ("sentinel://h:0", "entry 1 of the Sentinel list: the port is not a number from 1 to 65535"),
        ("sentinel://h:1;", "entry 2 of the Sentinel list is empty"),
        ("sentinel://h:1;;sentinel://h:2", "entry 2 of the Sentinel list is empty"),
        ("sentinel://h:1;redis://h:2", "entry 2 of the Sentinel list is not a sentinel:// URL"),
        ("sentinel://h:1/a", "entry 1 of the Sentinel list: the path is not a database number"),
        ("sentinel://h:1?ssl=1", "entry 1 of the Sentinel list has options"),
        ("sentinel://h:1/0;sentinel://h:2/1", "only the first entry of the Sentinel list names the database"),
        (f"sentinel://h:1;sentinel://:{PASSWORD}@h:2", "only the first entry of the Sentinel list may carry"),
        (f"sentinel://:{PASSWORD}@h:1;sentinel://:other@h:2", "only the first entry of the Sentinel list may carry"),
        ("redis://a:1/0;redis://b:1/0", "a list separated by ';' is only for sentinel:// URLs"),
        ("http://h", "expected a redis://, rediss://, unix:// or sentinel:// URL"),
        (f"redis://:{PASSWORD}@h:port/0", "Port could not be cast"),
        ("redis://h:0/0", "the port is not a number from 1 to 65535"),
        ("redis://", "the URL has no host"),
    ],
)
def test_a_bad_redis_url_is_refused_naming_the_variable_without_the_password(
    variable: str, url: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({variable: url})
    assert str(info.value).startswith(f"{variable}: {reason}")
    assert PASSWORD not in str(info.value)


def test_the_sentinel_master_is_a_name() -> None:
    assert Settings.from_env({}).sentinel_master == "mymaster"
    assert Settings.from_env({"CHORDBEAT_SENTINEL_MASTER": "jobs-primary.1"}).sentinel_master == "jobs-primary.1"
    for bad in (" mymaster", "my master", "-x", "a" * 101, "m\n"):
        with pytest.raises(ConfigError, match=r"^CHORDBEAT_SENTINEL_MASTER: expected a name"):
            Settings.from_env({"CHORDBEAT_SENTINEL_MASTER": bad})


def test_a_client_from_a_url_nobody_checked_fails_as_a_redis_error_not_a_value_error() -> None:
    """Recovery, beat and the step watch ride out :class:`redis.RedisError`; anything else would crash them.
    (Before, ``get_redis`` raised ValueError on every sentinel:// URL.)"""
    reset_clients()
    for url in ("sentinel://h", "http://h", "redis://h:port/0"):
        with pytest.raises(UnusableRedisUrl) as info:
            get_redis(url)
        assert isinstance(info.value, redis.RedisError)
    # A Sentinel list builds a client (it asks the Sentinels at its first command).
    assert isinstance(get_redis("sentinel://127.0.0.1:1/0"), redis.Redis)


def test_celery_kombu_and_redbeat_get_the_sentinel_list_and_the_master_with_the_password_masked() -> None:
    settings = Settings.from_env({"CHORDBEAT_BROKER_URL": LIST, "CHORDBEAT_SENTINEL_MASTER": "jobs"})
    conf = celery_config(settings)
    assert conf["broker_transport"] == SENTINEL_TRANSPORT
    assert conf["broker_transport_options"]["master_name"] == "jobs"
    assert conf["result_backend"] == LIST
    assert conf["result_backend_transport_options"]["master_name"] == "jobs"
    options = conf["redbeat_redis_options"]
    assert conf["redbeat_redis_url"].startswith("redis-sentinel://")
    assert options["sentinels"] == [["10.0.0.1", 26379], ["10.0.0.2", 26380], ["::1", 26381]]
    assert (options["service_name"], options["db"], options["password"]) == ("jobs", 2, PASSWORD)
    # What `celery inspect conf` and Flower show.
    assert PASSWORD not in repr(filter_hidden_settings(conf))
    plain = celery_config(Settings())
    assert plain["broker_transport"] == TRANSPORT
    assert "master_name" not in plain["broker_transport_options"]
