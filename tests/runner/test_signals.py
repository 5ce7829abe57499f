"""`GracefulStop`: a first signal is recorded, a second acts as before the run."""

from __future__ import annotations

import signal

import pytest

from jaxrl_llm.runner.signals import GracefulStop


def test_a_second_ctrl_c_interrupts_also_after_a_handler_python_did_not_install(monkeypatch):
    """`signal.signal` returns None for a handler installed outside Python; the second signal
    then called `signal.signal(signum, None)`, a TypeError, instead of interrupting."""
    real = signal.signal

    def from_outside(signum, handler):
        real(signum, handler)
        return None  # what Python reports for a handler it did not install

    monkeypatch.setattr(signal, "signal", from_outside)
    before = signal.getsignal(signal.SIGINT)
    try:
        with GracefulStop() as stop:
            stop._handle(signal.SIGINT, None)
            assert stop.requested and stop.signal_name == "SIGINT"
            with pytest.raises(KeyboardInterrupt):
                stop._handle(signal.SIGINT, None)
    finally:
        real(signal.SIGINT, before)
