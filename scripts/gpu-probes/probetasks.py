"""The read tasks of a probe's process, timed where they run: each
batchio task's start and end (perf_counter), bytes, file (the name's last
20 characters, no extension) and thread name. One wrapper for every probe
(smallprof's timeline, mainprobe), so that their task figures agree."""

import os
import threading
import time


def record_tasks(sink: list) -> None:
    """Appends (start, end, bytes, file, thread) to sink for every task
    run from now on in this process."""
    from phxmount import batchio
    run = batchio._Submitter._run_holding

    def run_holding(self, cols, keep):
        t = time.perf_counter()
        try:
            return run(self, cols, keep)
        finally:
            sink.append((t, time.perf_counter(), cols.nbytes, os.path.basename(self.path).rsplit(".", 1)[0][-20:],
                         threading.current_thread().name))
    batchio._Submitter._run_holding = run_holding
