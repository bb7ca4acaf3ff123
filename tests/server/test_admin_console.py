"""The admin port's web console (R-OPS-3) in real headless Chromium, against live daemons.

The shop (127.0.0.161) sends orders to the warehouse (127.0.0.162), which does not
receive them yet. The warehouse's console must show its queue with that depth, the
broker connection from the shop, open, and the conversation endpoint by state; after
its two-second refresh, the rates are figures, above zero while orders flow. A message
for a service no route reaches shows in the shop's transmission queue with its status
text. The screenshot is saved
under the test's ``tmp_path`` and its path printed; ``./dev console-image`` copies it
to ``docs/images/console.png``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from tests.daemons import FAST_RETRY, running, wait_until

HOSTS = ("127.0.0.161", "127.0.0.162")
ORDERS = 7


async def test_the_console_in_chromium(tmp_path: Path, chromium: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(chromium, WebDriver)
    d = shop_and_warehouse(tmp_path / "deployment", FAST_RETRY, hosts=HOSTS)
    with running(d):
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        for n in range(ORDERS):
            await shop.send(handle, ORDER, f"order {n}".encode())

        async def queued() -> bool:
            (row,) = [q for q in await warehouse.view("queues") if q["queue"] == "OrderQueue"]
            return bool(row["ready_messages"] == ORDERS)

        await wait_until(queued, 30)
        chromium.get(f"http://{HOSTS[1]}:8022/")
        page = chromium.find_element(By.TAG_NAME, "body").text
        assert "brokerd · beta" in page and "ready" in page

        # The page replaces its tables as it refreshes itself: each read is one script,
        # so it never holds an element the page has just replaced (a stale reference).
        def cells(table: str) -> list[list[str]]:
            rows: list[list[str]] = chromium.execute_script(
                "return Array.from(document.querySelectorAll('#' + arguments[0] + ' tr'))"
                ".slice(1).map(r => Array.from(r.querySelectorAll('td'))"
                ".map(c => c.innerText.trim()))",
                table,
            )
            return rows

        def text_of(element: str) -> str:
            text: str = chromium.execute_script(
                "const e = document.getElementById(arguments[0]);"
                "return e ? e.innerText.trim() : '';",
                element,
            )
            return text

        assert ["warehouse", "OrderQueue", "on", str(ORDERS), "0", "0"] in cells("queues")
        connections = cells("connections")
        assert any(row[1].startswith(HOSTS[0]) and row[3] == "open" for row in connections), (
            connections
        )
        assert ["warehouse", "CO", "1"] in cells("endpoints")
        assert any(row[1] == "ToShop" for row in cells("routes"))
        # the page refreshes itself: after two rounds, the rates are figures
        for n in range(ORDERS, ORDERS + 5):
            await shop.send(handle, ORDER, f"order {n}".encode())
        WebDriverWait(chromium, 15).until(lambda _: text_of("rate-delivered") not in ("", "\u2013"))
        WebDriverWait(chromium, 15).until(
            lambda _: (
                [
                    "warehouse",
                    "OrderQueue",
                    "on",
                    str(ORDERS + 5),
                    "0",
                    "0",
                ]
                in cells("queues")
            )
        )
        float(text_of("rate-delivered"))

        # the shop's side: the transmission queue of a conversation nobody answers
        other = await shop.begin_dialog(SHOP_SERVICE, "//nowhere/Service", CONTRACT)
        await shop.send(other, ORDER, b"lost order")
        chromium.get(f"http://{HOSTS[0]}:8022/")
        WebDriverWait(chromium, 15).until(lambda _: "//nowhere/Service" in text_of("peers"))
        status = text_of("transmission-queue")
        assert "//nowhere/Service" in status

        # the screenshot: the warehouse's page while orders flow (the rates move)
        async def steady_orders() -> None:
            n = 0
            while True:
                await shop.send(handle, ORDER, f"steady order {n}".encode())
                n += 1
                await asyncio.sleep(0.05)

        sender = asyncio.create_task(steady_orders())
        try:
            chromium.get(f"http://{HOSTS[1]}:8022/")

            def moving() -> bool:
                text = text_of("rate-delivered")
                return text not in ("", "\u2013") and float(text) > 0

            await wait_until(lambda: asyncio.to_thread(moving), 20, 0.2)
            shot = tmp_path / "console.png"
            assert chromium.save_screenshot(str(shot))
            print(f"\nconsole screenshot: {shot}")
        finally:
            sender.cancel()
        await shop.close()
        await warehouse.close()
