"""Stop signals never deadlock a process, however they arrive."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

from emberfs.common.signals import StopSignals


def test_a_signal_arriving_while_the_stop_event_is_locked_does_not_block():
    """The handler runs between two bytecodes of the main thread, perhaps inside the stop
    Event's own lock (an earlier handler's set(), or a wait waking up): it must not take it."""
    stop = threading.Event()
    signals = StopSignals(stop.set, install=False)
    handled = threading.Event()

    def main_thread_inside_the_event():
        with stop._cond:  # as inside Event.set() or Event.wait() of the main thread
            signals.handler(signal.SIGTERM, None)
            signals.handler(signal.SIGINT, None)  # a second one, nested
            handled.set()

    worker = threading.Thread(target=main_thread_inside_the_event, daemon=True)
    worker.start()
    assert handled.wait(5), "the signal handler blocked on the Event's lock"
    assert stop.wait(5)


def test_a_process_stops_once_on_a_burst_of_signals():
    script = textwrap.dedent(
        """
        import threading
        from emberfs.common.signals import StopSignals
        stop = threading.Event()
        calls = []
        StopSignals(lambda: (calls.append(1), stop.set()))
        print("ready", flush=True)
        while not stop.wait(0.001):
            pass
        print("stopped", len(calls), flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    for i in range(200):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGTERM if i % 2 else signal.SIGINT)
    assert proc.wait(10) == 0
    assert proc.stdout.read().split() == ["stopped", "1"]
