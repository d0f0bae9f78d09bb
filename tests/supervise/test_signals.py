"""The trainer's signal handlers and its bounds on a stop (supervise/signals.py), in this process with real
signals; the processes that act on them are tested in test_checkpoint, test_faults and test_watchdog."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from x1_pretrain.core.contract import WATCHDOG_PID_ENV
from x1_pretrain.supervise.signals import StopDeadline, install_signal_handlers, watch_parent
from x1_pretrain.trainer.loop import StopFlag


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_only_sets_the_flag_once(sig):
    stop = StopFlag()
    restore = install_signal_handlers(stop)
    try:
        os.kill(os.getpid(), sig)
        assert stop.requested == signal.Signals(sig).name and stop.requested_at is not None
        first = stop.requested_at
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM changes nothing
        assert stop.requested_at == first
        if sig == signal.SIGINT:
            with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C aborts
                os.kill(os.getpid(), signal.SIGINT)
    finally:
        restore()


def test_sigusr1_asks_for_a_checkpoint_and_the_old_handlers_come_back():
    before = signal.getsignal(signal.SIGUSR1)
    stop = StopFlag()
    restore = install_signal_handlers(stop)
    os.kill(os.getpid(), signal.SIGUSR1)
    restore()
    assert stop.checkpoint_now and stop.requested is None and signal.getsignal(signal.SIGUSR1) is before


def test_the_stop_deadline_fires_once_the_grace_has_passed():
    stop, fired = StopFlag(), threading.Event()
    deadline = StopDeadline(stop, 0.2, fired.set, poll_s=0.01).start()
    try:
        assert deadline.remaining() is None and not fired.wait(0.1)  # no stop asked: nothing happens
        stop.requested, stop.requested_at = "SIGTERM", __import__("time").monotonic()
        assert fired.wait(10)
    finally:
        deadline.close()


def test_a_trainer_whose_watchdog_is_gone_stops(monkeypatch):
    """The watchdog's pid is watched; when that process ends, the flag is set as by SIGTERM."""
    parent = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    monkeypatch.setenv(WATCHDOG_PID_ENV, str(parent.pid))
    stop = StopFlag()
    done = watch_parent(stop, every_s=0.02)
    try:
        parent.stdin.close()
        parent.wait(timeout=30)
        for _ in range(1000):
            if stop.requested is not None:
                break
            threading.Event().wait(0.01)
        assert stop.requested == "the watchdog's end"
    finally:
        done.set()
