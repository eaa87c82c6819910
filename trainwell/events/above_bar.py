"""Log messages above the training bar: each one on a line of its own, the bar redrawn below it.

A tqdm bar leaves the cursor at the end of its line, so a message written to the same terminal meanwhile (Ctrl-C's
"Received SIGINT: ...", a warning from the loop) would continue the bar's line. While ``ProgressCallback`` draws a
bar, ``LogsAboveBar`` routes the messages that would reach the terminal through tqdm's ``external_write_mode``
(which clears the bar line first and redraws the bar after): those of Python's handler of last resort (what prints
a library's warnings when the application configured no logging) and of the stream handlers on the root and
``trainwell`` loggers that write to stdout or stderr. ``uninstall`` puts everything back; a handler left installed
(``train()`` ended by an exception, with no ``on_train_end``) still writes each message whole, to the stream of the
moment. tqdm is never imported here: the bar's class is handed in.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TextIO


class _AboveBar:
    """A text stream that writes through ``bar_class.external_write_mode`` (the bar cleared, then redrawn)."""

    def __init__(self, stream_of: Callable[[], TextIO], bar_class: Any) -> None:
        self._stream_of = stream_of
        self._bar_class = bar_class

    def write(self, text: str) -> int:
        stream = self._stream_of()
        with self._bar_class.external_write_mode(file=stream):
            written = stream.write(text)
            stream.flush()
        return written

    def flush(self) -> None:
        self._stream_of().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream_of(), name)


class LogsAboveBar:
    """Installs and removes the routing described in the module docstring (one instance per bar)."""

    def __init__(self, bar_class: Any) -> None:
        self._bar_class = bar_class
        self._streams: list[tuple[logging.StreamHandler, TextIO]] = []
        self._last_resort: tuple[logging.Handler | None, logging.Handler] | None = None

    def install(self) -> None:
        previous = logging.lastResort
        if previous is not None:
            mine = logging.StreamHandler(_AboveBar(lambda: sys.stderr, self._bar_class))  # type: ignore[arg-type]
            mine.setLevel(previous.level)
            self._last_resort = (previous, mine)
            logging.lastResort = mine
        for logger in (logging.getLogger(), logging.getLogger("trainwell")):
            for handler in logger.handlers:
                stream = getattr(handler, "stream", None)
                if type(handler) is logging.StreamHandler and stream in (sys.stdout, sys.stderr):
                    self._streams.append((handler, stream))
                    handler.setStream(_AboveBar(lambda s=stream: s, self._bar_class))  # type: ignore[arg-type]

    def uninstall(self) -> None:
        for handler, stream in self._streams:
            if isinstance(handler.stream, _AboveBar):
                handler.setStream(stream)
        self._streams.clear()
        if self._last_resort is not None and logging.lastResort is self._last_resort[1]:
            logging.lastResort = self._last_resort[0]
        self._last_resort = None


__all__ = ["LogsAboveBar"]
