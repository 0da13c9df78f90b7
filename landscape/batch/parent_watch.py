"""A Dask worker preload for ``landscape batch --workers N``: the worker exits when the batch process dies
(distributed's own pipe guard fails with forked workers, which inherit each other's write end)."""

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
