"""Headless Chromium for the tests of pages (Debian's ``chromium`` and
``chromium-driver``, through Selenium): the ``chromium`` fixture yields a WebDriver.

It skips, saying why, only when Chromium or its driver is absent outside CI (``CI``
set): CI installs them (``./dev``), so there it must run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def _browser() -> tuple[str, str] | None:
    binary = next((found for name in CHROMIUM if (found := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    return (binary, driver) if binary and driver else None


@pytest.fixture
def chromium() -> Iterator[object]:
    found = _browser()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver must be installed in CI (./dev setup)")
        pytest.skip(
            "chromium or chromedriver not installed (apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(found[1]))
    try:
        yield driver
    finally:
        driver.quit()
