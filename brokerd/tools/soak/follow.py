"""How the soak's applications find the principal of the mirrored pair B.

An application of a mirrored database talks to one partner at a time and moves to the
other when the one it uses fails it: the connection breaks or does not open (the
daemon was killed), or a verb answers ``not_principal`` (SPEC R-ROUTE-10, R-ROUTE-15).
Before it uses a partner it asks that partner's role and epoch (the ``mirrors`` view)
and accepts it only as principal at the highest epoch it has seen, as a sending
broker does (R-ROUTE-15): an old principal restarted after a failover still says
``principal`` at its old epoch until it is demoted, and must not serve the
application in between (what it committed then would be lost when it becomes the
mirror). The highest epoch seen is kept in a file, so a restarted application
remembers it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from brokerd.sdk.client import BrokerClient
from protocol.errors import ClientError, RemoteError


class Follower:
    """The partner an application uses, among ``partners`` ((host, port, token file))."""

    def __init__(
        self,
        partners: list[tuple[str, int, Path]],
        database: str,
        epoch_file: Path | None = None,
    ) -> None:
        self.partners = partners
        self.database = database
        self.epoch_file = epoch_file
        self.current = 0
        self.epoch = -1
        if epoch_file is not None and epoch_file.exists():
            with contextlib.suppress(ValueError):
                self.epoch = int(epoch_file.read_text().strip() or -1)

    @property
    def mirrored(self) -> bool:
        return len(self.partners) > 1

    def switch(self) -> None:
        """Use the other partner from now on."""
        self.current = (self.current + 1) % len(self.partners)

    async def connect(self, timeout: float = 3.0) -> BrokerClient:
        """A client of the partner in use, checked to be the principal at the highest
        epoch seen; otherwise :class:`ClientError` and the next call tries the other."""
        host, port, token_file = self.partners[self.current]
        try:
            client = await BrokerClient.connect(
                host, port, token_file=token_file, timeout=timeout, reconnect=False
            )
        except (ClientError, OSError) as exc:
            if self.mirrored:
                self.switch()
            raise ClientError(f"{host}: {exc}") from None
        if not self.mirrored:
            return client
        try:
            role, epoch = await self._role(client)
        except (ClientError, RemoteError) as exc:
            await client.close()
            self.switch()
            raise ClientError(f"{host}: role unknown ({exc})") from None
        if role != "principal" or epoch < self.epoch:
            await client.close()
            self.switch()
            raise ClientError(f"{host} is {role} at epoch {epoch}, not the principal")
        self._saw(epoch)
        return client

    async def _role(self, client: BrokerClient) -> tuple[str, int]:
        for row in await client.view("mirrors"):
            if row.get("kind") == "local database" and row.get("name") == self.database:
                return str(row["role"]), int(row["epoch"])
        raise ClientError(f"database {self.database} is not mirrored there")

    def _saw(self, epoch: int) -> None:
        if epoch <= self.epoch:
            return
        self.epoch = epoch
        if self.epoch_file is not None:
            self.epoch_file.write_text(f"{epoch}\n")
