"""A run's time budget (gpu_shapes.py): its steps, each run only where its
estimate fits the seconds left, the plan and the actuals printed."""

import time

from benchlib import say


class Budget:
    """The steps of a run and the seconds left for them: a step runs only
    where its estimate fits what is left, and every process it starts
    gets no more than what is left. The plan and the actuals are printed."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds
        self.log = []

    def left(self) -> float:
        return self.end - time.monotonic()

    def run(self, name: str, estimate: float, fn):
        """fn() if estimate fits; else None, and the step is skipped. A step
        that raises is a failure of the run (failures()), and the next runs."""
        left = self.left()
        if estimate > left:
            self.log.append((name, estimate, None, f"not run: needs ~{estimate:.0f} s, {left:.0f} s left"))
            say(f"--- {name}: NOT RUN (time budget: needs ~{estimate:.0f} s, {left:.0f} s left)")
            return None
        say(f"--- {name} (estimate {estimate:.0f} s, {left:.0f} s left)")
        t0 = time.monotonic()
        why = ""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001: the other steps still run; the rows of this one say why
            why = f"failed: {type(e).__name__}: {e}"
            say(f"FAIL {name}: {why}")
            return None
        finally:
            took = time.monotonic() - t0
            self.log.append((name, estimate, took, why))
            say(f"    {name}: {took:.1f} s (estimate {estimate:.0f} s)")

    def why(self, name: str) -> str:
        for n, _, _, why in self.log:
            if n == name and why:
                return why
        return ""

    def failures(self) -> list:
        return [f"step {n!r} {why}" for n, _, took, why in self.log if took is not None and why]

    def table(self) -> str:
        lines = ["| step | estimate s | took s | |", "| --- | --- | --- | --- |"]
        lines += [f"| {n} | {e:.0f} | {'' if t is None else f'{t:.1f}'} | {w} |" for n, e, t, w in self.log]
        return "\n".join(lines)
