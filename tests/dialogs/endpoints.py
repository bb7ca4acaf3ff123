"""An endpoint of a conversing dialog, made in memory for the tests of its rules."""

from __future__ import annotations

import time
import uuid

from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.states import State


def conversing_endpoint(send_sequence: int = 0) -> Endpoint:
    ep = Endpoint(
        uuid.uuid4(),
        uuid.uuid4(),
        True,
        uuid.uuid4(),
        "shop",
        "//a",
        "//b",
        None,
        "//c",
        State.CONVERSING,
        0,
        time.time(),
    )
    ep.send_sequence = send_sequence
    return ep
