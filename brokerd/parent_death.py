"""Child processes that die with the process that started them, however it ends.

``setpriv --pdeathsig KILL --`` (util-linux, in every Debian) put before a command sets
its parent-death signal and executes the command in its place (the same pid): the
child gets SIGKILL when its parent ends, also by SIGKILL, where nothing of the parent
runs to stop it. (Not ``preexec_fn``: Python code between fork and exec is unsafe in a
process with threads.) The daemon starts its activated instances so, the soak its
daemons and consumers.

The "parent" is the *thread* that started the child: a child started from a thread
that ends (a worker of an executor shut down) gets the signal then. Start such
children from a thread that lasts as long as the process should (the main thread, or
an executor's worker, kept until the executor shuts down).

May import: the standard library only.
"""

from __future__ import annotations

import shutil
import sys


def _dies_with_parent() -> tuple[str, ...]:
    """The words put before a command so that it dies (SIGKILL) with its parent; none
    where ``setpriv`` is missing (not Linux): there the child outlives its parent."""
    if not sys.platform.startswith("linux"):
        return ()
    setpriv = shutil.which("setpriv")
    return (setpriv, "--pdeathsig", "KILL", "--") if setpriv else ()


DIES_WITH_PARENT = _dies_with_parent()
