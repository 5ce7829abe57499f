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


def test_a_sigterm_after_a_ctrl_c_keeps_the_stop_graceful():
    """Any second signal escalated: a scheduler's SIGTERM after a Ctrl-C killed the run
    mid-step. Only a second signal of the same kind acts as before the run."""
    with GracefulStop() as stop:
        stop._handle(signal.SIGINT, None)
        stop._handle(signal.SIGTERM, None)  # recorded; the stop stays graceful
        assert stop.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            stop._handle(signal.SIGINT, None)


def test_a_signal_ignored_before_the_run_stays_ignored():
    """A background job's SIGINT is SIG_IGN: the run neither stops on it nor raises on a second
    one; SIGTERM is still handled."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with GracefulStop() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == stop._handle
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            assert not stop.requested
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
