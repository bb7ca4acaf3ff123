"""The admin port itself: :class:`AdminPort` serves ``/healthz`` (the process answers),
``/readyz`` (databases open and listeners up: 200, else 503), ``/metrics``
(Prometheus), ``/`` (the console), ``/console/body`` and ``/console.json``.

May import: the modules of ``brokerd.server.admin_http``, ``brokerd.config``.
"""

from __future__ import annotations

from collections.abc import Mapping

from brokerd.server.admin_http import console, metrics
from brokerd.server.admin_http.http import Handler, HttpServer, Response, names_answered, text
from brokerd.server.admin_http.snapshot import AdminBroker, take

HTML = "text/html; charset=utf-8"


class AdminPort:
    """The HTTP server of ``broker.config.admin``, started first and stopped last, so
    that ``/healthz`` answers during start-up and ``/readyz`` says when it is over."""

    def __init__(self, broker: AdminBroker) -> None:
        self.broker = broker
        admin = broker.config.admin
        assert admin.host is not None
        routes: dict[str, Handler] = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": self._metrics,
            "/": self._console,
            "/console/body": self._console_body,
            "/console.json": self._console_json,
        }
        names = None if admin.any_name else names_answered(admin.host, admin.names)
        self.server = HttpServer(admin.host, admin.port, routes, names)

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()

    async def _healthz(self, _: Mapping[str, str]) -> Response:
        return text(200, "ok")

    async def _readyz(self, _: Mapping[str, str]) -> Response:
        if self.broker.ready:
            return text(200, "ready")
        return text(503, "starting or stopping: databases or listeners are not up")

    async def _metrics(self, _: Mapping[str, str]) -> Response:
        return Response(200, metrics.render(await take(self.broker)), metrics.CONTENT_TYPE)

    async def _console(self, _: Mapping[str, str]) -> Response:
        return Response(200, console.page(await take(self.broker)), HTML)

    async def _console_body(self, _: Mapping[str, str]) -> Response:
        return Response(200, console.body(await take(self.broker)), HTML)

    async def _console_json(self, _: Mapping[str, str]) -> Response:
        return Response(200, console.json(await take(self.broker)), "application/json")
