"""Graceful stop on SIGTERM / SIGINT (Ctrl-C): finish the current step, checkpoint, exit.

`GracefulStop` installs handlers that only record the signal; the loop checks `requested`
after each step, writes a checkpoint and returns. A second signal of the same kind restores
the previous handler's behaviour immediately (a second Ctrl-C interrupts at once); a SIGTERM
after a Ctrl-C (a scheduler's) is recorded like the first and the stop stays graceful. A signal
the process ignored before the run (`SIG_IGN`, e.g. SIGINT of a background job) stays ignored.
Handlers are installed only in the main thread (Python delivers signals there) and are restored
on exit.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    """Context manager recording SIGTERM / SIGINT (module docstring).

    Examples:
      >>> import os
      >>> with GracefulStop() as stop:
      ...     os.kill(os.getpid(), signal.SIGTERM)
      ...     stop.requested, stop.signal_name
      (True, 'SIGTERM')
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._received: set[int] = set()

    @property
    def requested(self) -> bool:
        """Whether a stop signal arrived."""
        return self.signum is not None

    @property
    def signal_name(self) -> str | None:
        """`"SIGTERM"` / `"SIGINT"`, or None."""
        return None if self.signum is None else signal.Signals(self.signum).name

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum in self._received:  # a second signal of this kind: behave as before this run
            previous = self._previous.get(signum, signal.SIG_DFL)
            signal.signal(signum, previous)
            if callable(previous):
                previous(signum, frame)
            elif signum == signal.SIGINT:
                raise KeyboardInterrupt
            else:
                signal.raise_signal(signum)
            return
        self._received.add(signum)
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                if signal.getsignal(signum) is signal.SIG_IGN:
                    continue  # ignored before the run (a background job's SIGINT): stays so
                previous = signal.signal(signum, self._handle)
                # None: a handler installed outside Python, which Python cannot reinstall
                self._previous[signum] = signal.SIG_DFL if previous is None else previous
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        self._received = set()
