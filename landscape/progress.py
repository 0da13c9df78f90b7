"""Progress of long work on stderr: a bar on a terminal (tqdm), elsewhere one line every ~10 s (what, how
far, ETA) from a watcher thread, so it comes on time. Off unless turned on (the command line does; Python:
``with progress.enabled(): ...``); a context variable holds it, so a new thread or worker starts silent.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

INTERVAL = 10.0  # seconds between two plain lines
INTERVAL_ENV = "LANDSCAPE_PROGRESS_INTERVAL"
BAR_DELAY = 1.0  # seconds before a bar appears (work shorter than that draws nothing)
FIRST_LINE = 0.2  # the first plain line comes this fraction of the interval after the first task (2 s of 10)


class _Display:
    """One turned-on progress display: where it writes, in which form, and the open tasks (outermost first)."""

    def __init__(self, stream: TextIO | None, bar: bool | None, interval: float | None):
        self._stream = stream
        self.bar = bar if bar is not None else _isatty(self.stream)
        self.interval = interval if interval is not None else _interval_from_env()
        self.tasks: list[Task] = []
        self.lock = threading.RLock()
        self.last: float | None = None  # when the last plain line was written
        self.began: float | None = None  # when the first task opened
        self._stop: threading.Event | None = None
        self._watcher: threading.Thread | None = None

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr  # read late: a test may replace sys.stderr

    def write(self, text: str) -> None:
        with self.lock:
            if self.bar and any(t.bar is not None for t in self.tasks):
                from tqdm import tqdm

                tqdm.write(text, file=self.stream)  # above the bars, which are drawn again
            else:
                print(text, file=self.stream, flush=True)

    def line(self) -> str:
        return " > ".join(t.describe() for t in list(self.tasks))

    def tick(self) -> None:
        """The plain line, when ``interval`` has passed since the last one (the first comes sooner)."""
        with self.lock:
            now = time.monotonic()
            due = self.began + FIRST_LINE * self.interval if self.last is None else self.last + self.interval
            if self.tasks and now >= due:
                self.last = now
                with contextlib.suppress(ValueError, OSError):  # a closed stream ends the lines, not the work
                    print(self.line(), file=self.stream, flush=True)

    def opened(self, task: Task) -> None:
        with self.lock:
            self.tasks.append(task)
            if self.began is None:
                self.began = time.monotonic()
            if not self.bar and self._watcher is None:
                self._stop = threading.Event()
                self._watcher = threading.Thread(target=self._watch, args=(self._stop,), name="landscape-progress",
                                                 daemon=True)
                self._watcher.start()

    def closed(self, task: Task) -> None:
        with self.lock:
            if task in self.tasks:
                self.tasks.remove(task)
            watcher, stop = (self._watcher, self._stop) if not self.tasks else (None, None)
            if watcher is not None:
                self._watcher = self._stop = None
        if watcher is not None:
            stop.set()
            if watcher is not threading.current_thread():
                watcher.join()

    def _watch(self, stop: threading.Event) -> None:
        pause = max(0.01, min(self.interval / 4, 1.0))
        while not stop.wait(pause):
            self.tick()


_DISPLAY: contextvars.ContextVar[_Display | None] = contextvars.ContextVar("landscape_progress", default=None)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _interval_from_env() -> float:
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return INTERVAL
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        from landscape.errors import UsageError

        raise UsageError(f"{INTERVAL_ENV}={text!r}: give the seconds between progress lines, a number > 0")
    return value


@contextlib.contextmanager
def enabled(on: bool | None = True, *, stream: TextIO | None = None, bar: bool | None = None,
            interval: float | None = None) -> Iterator[None]:
    """Progress on (``on=True``) or off (``on=False``) inside the block; ``on=None`` changes nothing.

    ``stream``: default ``sys.stderr``; ``bar``: tqdm bars (default: on a terminal) or plain lines;
    ``interval``: seconds between lines. In a block with it on, the outer display stays unless one is given.
    """
    if on is None or (on and _DISPLAY.get() is not None and stream is None and bar is None and interval is None):
        yield
        return
    token = _DISPLAY.set(_Display(stream, bar, interval) if on else None)
    try:
        yield
    finally:
        _DISPLAY.reset(token)


def active() -> bool:
    """Whether progress is on here."""
    return _DISPLAY.get() is not None


def bars() -> bool:
    """Whether progress is on here and drawn as bars (stderr a terminal)."""
    display = _DISPLAY.get()
    return display is not None and display.bar


def note(text: str) -> None:
    """One line on the progress stream (a step finished: a recipe, a run, a batch job), when progress is on."""
    display = _DISPLAY.get()
    if display is not None:
        display.write(text)


def echo(text: str) -> None:
    """One line on stderr whether progress is on or not, written above the bars, so none is torn."""
    display = _DISPLAY.get()
    if display is not None:
        display.write(text)
    else:
        print(text, file=sys.stderr, flush=True)


def task(what: str, total: float | None = None, *, unit: str = "", done: float = 0, leave: bool = False) -> Task:
    """A unit of long work (``update(n)`` as it advances, a ``with`` block or ``close()``): ``total`` counts
    its ``unit`` (None: unknown), ``done`` is where it starts; ``leave`` keeps its bar. Free when off."""
    display = _DISPLAY.get()
    if display is None:
        return SILENT
    return Task(display, what, total, unit=unit, done=done, leave=leave)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _count(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


class Task:
    """One open task of a display: counts, a bar on a terminal, a part of the plain line elsewhere."""

    def __init__(self, display: _Display, what: str, total: float | None, *, unit: str, done: float, leave: bool):
        self.display, self.what, self.total, self.unit = display, what, total, unit
        self.done = self.start = done
        self.started = self.moved = time.monotonic()
        self.info = ""
        self.bar = None
        self._closed = False
        if display.bar:
            from tqdm import tqdm

            depth = len(display.tasks)
            self.bar = tqdm(total=total, initial=done, desc=what, unit=f" {unit}" if unit else "it",
                            file=display.stream, leave=leave and depth == 0, delay=BAR_DELAY, dynamic_ncols=True)
        display.opened(self)

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        """``n`` more units done."""
        self.done += n
        self.moved = time.monotonic()
        if self.bar is not None:
            self.bar.update(n)

    def describe_as(self, info: str) -> None:
        """What the bar and line show after the counts (``epoch 2.00, loss 0.41, eps 3.1``)."""
        self.info = info
        if self.bar is not None:
            self.bar.set_postfix_str(info, refresh=False)  # drawn at the bar's next refresh (and when it closes)

    def eta(self) -> float:
        """Seconds left at the rate so far, less the time spent on the unit under way (NaN if unknown)."""
        gained = self.done - self.start
        if self.total is None or gained <= 0:
            return math.nan
        left = (self.moved - self.started) / gained * max(0.0, self.total - self.done)
        return max(0.0, left - (time.monotonic() - self.moved))

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            counts = (f"{_count(self.done)}/{_count(self.total)}{unit} ({100 * self.done / self.total:.0f}%, "
                      f"ETA {_duration(self.eta())})")
        else:
            counts = f"{_count(self.done)}{unit} ({_duration(time.monotonic() - self.started)})"
        return f"{self.what}: {counts}" + (f", {self.info}" if self.info else "")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.bar is not None:
            self.bar.close()
        self.display.closed(self)


class _Silent(Task):
    """The task of a display that is off: every call does nothing."""

    def __init__(self) -> None:
        self.bar = None

    def update(self, n: float = 1) -> None:
        pass

    def describe_as(self, info: str) -> None:
        pass

    def close(self) -> None:
        pass


SILENT = _Silent()  # the task of a display that is off (a default argument for loops)

