"""The report page, drawn by a real browser from real daemons' traces.

Two real daemons (alpha on 127.0.0.141, beta on 127.0.0.142) exchange orders; beta is
killed (SIGKILL) and started again while alpha has orders for it, which alpha
retransmits. ``brokerd analyze``'s jobs run over both trace folders (the shared Spark
session) and write ``report.html``, which headless Chromium (Debian's ``chromium`` and
``chromium-driver``, through Selenium) opens from the file, offline. The page must show
the audit's verdict first, the headline figures the analysis computed (the refused
connections to the dead beta among the faults, its restart), and every chart drawn (an
SVG of non-zero size in each chart's place). The screenshot is saved under the test's
``tmp_path`` and its path printed; ``./dev report-image`` copies it to
``docs/images/report.png``.

The test is skipped, saying why, only when Chromium or its driver is absent outside CI
(``CI`` set): CI installs them (``./dev``), so there it must run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pyspark.sql import SparkSession

from brokerd.analytics.page import FAULTS, verdict
from brokerd.analytics.report import analyze, write_report
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from tests.daemons import FAST_RETRY, drain, running

HOSTS = ("127.0.0.141", "127.0.0.142")
CHARTS = ("timeline", "latency-route", "latency-hop")


async def _orders_through_a_kill(root: Path) -> list[Path]:
    """Orders to beta, beta killed and started again with orders waiting; returns the
    daemons' trace folders."""
    d = shop_and_warehouse(root, FAST_RETRY, hosts=HOSTS)
    with running(d):
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handles = [
            await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(2)
        ]
        for n in range(20):
            await shop.send(handles[n % 2], ORDER, f"order {n}".encode())
        await drain(warehouse, "OrderQueue", 20)
        await warehouse.close()
        await asyncio.sleep(0.5)  # beta's trace writer flushes what it has
        d.kill("beta")
        for n in range(6):
            await shop.send(handles[n % 2], ORDER, f"order after the kill {n}".encode())
        await asyncio.sleep(0.8)  # alpha retransmits to nobody
        d.start("beta")
        warehouse = await d.daemons["beta"].client()
        await drain(warehouse, "OrderQueue", 6)
        await shop.close()
        await warehouse.close()
    return [d.daemons[name].directory / "data" / "traces" for name in ("alpha", "beta")]


async def test_the_report_page_in_chromium(
    tmp_path: Path, spark: SparkSession, chromium: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(chromium, WebDriver)
    traces = await _orders_through_a_kill(tmp_path / "deployment")
    result = analyze(traces, spark=spark, progress=None)
    assert next(p.ended for p in result.processes if p.instance == "beta") in (
        "restarted",
        "killed",
    )
    _, html = write_report(result, tmp_path / "report")

    chromium.get(html.resolve().as_uri())
    WebDriverWait(chromium, 30).until(
        lambda d: all(
            d.find_element(By.ID, f"chart-{c}").get_attribute("data-rendered") == "yes"
            for c in CHARTS
        )
    )
    # the verdict first, in the audit's words
    first = chromium.find_element(By.CSS_SELECTOR, "main > section")
    assert first.get_attribute("id") == "verdict"
    assert verdict(result.audit)["summary"] in first.text
    # the headline figures, in plain words, as the analysis computed them
    cards = {
        c.find_element(By.CLASS_NAME, "name").text: c.find_element(By.CLASS_NAME, "value").text
        for c in chromium.find_elements(By.CSS_SELECTOR, "#headline .card")
    }
    t = result.totals
    assert cards["Messages delivered"] == f"{t['messages_delivered']:,}"
    assert t["messages_delivered"] == 26  # every order, once
    assert cards["Retransmissions"] == f"{t['retransmissions']:,}"
    # alpha dialled beta while it was down: refused connections are the faults
    assert t["connections_refused"] > 0
    assert cards["Faults"] == f"{sum(t[k] for k in FAULTS):,}"
    assert cards["Restarts"] == "1"
    assert cards["Median latency"].endswith(("ms", " s"))
    # every chart drawn: an SVG of non-zero size in its place
    for c in CHARTS:
        svg = chromium.find_element(By.CSS_SELECTOR, f"#view-{c} svg")
        assert svg.size["width"] > 200 and svg.size["height"] > 100, (c, svg.size)
    marks = chromium.find_elements(
        By.CSS_SELECTOR, "#view-timeline svg path, #view-timeline svg circle"
    )
    assert marks
    assert "restart" in chromium.find_element(By.ID, "view-timeline").get_attribute("innerHTML")

    height = chromium.execute_script("return document.documentElement.scrollHeight")
    chromium.set_window_size(1280, min(int(height) + 40, 6000))
    shot = tmp_path / "report.png"
    assert chromium.save_screenshot(str(shot))
    print(f"\nreport screenshot: {shot}")
