"""The soak's own SDK connections to its daemons (the producers', and the driver's
questions to one daemon).

:class:`Clients` keeps one connection per daemon for the producers and dials it again
after it breaks; with a mirrored B, the one named ``b`` follows B's principal
(:mod:`.follow`). :func:`direct` opens a connection to one daemon by name, whatever
its role (a failover asks both partners; the drain asks every daemon).

May import: ``brokerd.sdk``, ``brokerd.tools.launcher``, :mod:`.topology`,
:mod:`.follow`.
"""

from __future__ import annotations

import asyncio

from brokerd.sdk.client import BrokerClient
from brokerd.tools.launcher import Deployment
from brokerd.tools.soak import topology
from brokerd.tools.soak.follow import Follower


class Clients:
    """One SDK connection per daemon, dialled again after it breaks. With a mirrored B,
    the connection named ``b`` goes to B's principal, whichever partner that is: it
    moves to the other partner when the connection breaks or a verb answers
    ``not_principal`` (:mod:`.follow`)."""

    def __init__(self, deployment: Deployment, mirror: bool) -> None:
        self._deployment = deployment
        self._clients: dict[str, BrokerClient] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        names = topology.PARTNERS if mirror else topology.PARTNERS[:1]
        partners = [deployment.daemons[n] for n in names]
        self._followers = {
            "b": Follower(
                [(d.host, d.client_port, d.token_file) for d in partners], topology.DATABASE_B
            )
        }

    async def get(self, name: str) -> BrokerClient:
        async with self._locks.setdefault(name, asyncio.Lock()):
            client = self._clients.get(name)
            if client is not None:
                return client
            follower = self._followers.get(name)
            if follower is not None:
                client = await follower.connect(timeout=3)
            else:
                client = await direct(self._deployment, name)
            self._clients[name] = client
            return client

    async def drop(self, name: str, client: BrokerClient, *, moved: bool = False) -> None:
        """Forget a broken connection; ``moved``: it failed as the principal's would not
        (connection lost, ``not_principal``), so the next one tries the other partner."""
        if self._clients.get(name) is client:
            del self._clients[name]
            follower = self._followers.get(name)
            if moved and follower is not None and follower.mirrored:
                follower.switch()
        await client.close()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


async def direct(deployment: Deployment, name: str) -> BrokerClient:
    daemon = deployment.daemons[name]
    return await BrokerClient.connect(
        daemon.host,
        daemon.client_port,
        token_file=daemon.token_file,
        timeout=3,
        reconnect=False,  # the soak's clients reconnect by themselves, to see every loss
    )
