"""Debian's Chromium driven by its chromedriver (Selenium), for tests of what a person sees.

Nothing is downloaded: the driver and the browser are the system's (deploy/local/system-deps.sh
installs them).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from tests.support.servers import wait_for
from tests.support.web_server import WebServer

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)


@contextmanager
def chromium() -> Iterator[WebDriver]:
    """A headless Chromium with a profile of its own, quit at the end of the block."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail("chromium and chromium-driver are not installed (make test installs them)")
    profile = tempfile.mkdtemp(prefix="chordbeat-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


#: An instant as ISO 8601 writes it, which people's views must not show.
ISO = re.compile(r"T\d\d:\d\d.*Z")


def log_in(driver: WebDriver, web: WebServer, user: tuple[str, str]) -> None:
    driver.delete_all_cookies()
    driver.get(web.url + "/")
    assert "/login" in driver.current_url  # no session: the login form, not the page
    driver.find_element(By.NAME, "username").send_keys(user[0])
    driver.find_element(By.NAME, "password").send_keys(user[1])
    driver.find_element(By.ID, "login").click()
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "table.schedules"), 20, what="the schedules page")


def page_text(driver: WebDriver | WebElement, css: str) -> str:
    return " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, css))


def row_of(driver: WebDriver, name: str) -> Any:
    return driver.find_element(By.XPATH, f"//tr[.//a[contains(@class, 'name') and text()='{name}']]")


def no_iso(driver: WebDriver) -> None:
    """People's views show no ISO instant (those stay in datetime= attributes)."""
    text = driver.find_element(By.TAG_NAME, "body").text
    assert not ISO.search(text), ISO.search(text)


def confirm(driver: WebDriver, reason: str | None = None, payload: str | None = None) -> None:
    """On a confirmation page: fill in what is given, then confirm."""
    wait_for(lambda: driver.find_elements(By.ID, "confirm"), 20, what="the confirmation page")
    if payload is not None:
        field = driver.find_element(By.ID, "payload")
        field.clear()
        field.send_keys(payload)
    if reason is not None:
        driver.find_element(By.ID, "reason").send_keys(reason)
    driver.find_element(By.ID, "confirm").click()


def nothing_wider_than_the_window(driver: WebDriver) -> None:
    """The page scrolls no sideways: no element of ``main`` reaches past the window (the last five
    that do are named)."""
    wide = driver.execute_script(
        "const d = document.documentElement; return [d.scrollWidth, d.clientWidth,"
        " [...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right > d.clientWidth)"
        ".map(e => e.tagName + '.' + e.className + ':' + e.textContent.slice(0, 40)).slice(-5)]"
    )
    assert wide[0] <= wide[1], wide
