"""A Dask worker preload for ``landscape batch --workers N``: the worker exits when the batch process dies.

Distributed's own guard is a pipe whose write end only the worker's parent should hold; with forked workers
a worker can inherit another worker's write end (the local cluster starts them concurrently), and then two
workers may keep each other alive after the batch process is SIGKILLed. Here both workers were still running
10 s after such a kill in 2 of 29 tries (and one test failed so, once); the cause above is our reading of
distributed's code, not proven. This preload does not depend on it: it polls the parent process id, and
when the batch process is gone (the worker is re-parented) the worker exits at once.
"""

from __future__ import annotations

import os
import threading
import time

POLL_SECONDS = 0.5


def dask_setup(worker) -> None:  # noqa: ARG001  (Dask's preload interface)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="landscape-parent-watch", daemon=True).start()
