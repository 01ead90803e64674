"""The hook's read-ahead (hook_ahead.ReadAhead) on its own, no mount: the
window refills in starts of at least 1/REFILL of it, keys whose tensors
are deferred with a guessed region are held for them, and one without a
guess stops it."""

import threading
import unittest

from phxmount.hook_ahead import REFILL, ReadAhead
from phxmount.hook_plan import Ahead


class ReadAheadTest(unittest.TestCase):
    def setUp(self):
        self.lock = threading.RLock()
        self.keys = [f"k{i:03d}" for i in range(200)]

    def loop(self, size, window, whole=None, region=None):
        """get_tensor of every key in order; returns the groups each call
        deferred or held (after the first), and the read-ahead's Ahead."""
        ra = ReadAhead(self.keys, {k: size for k in self.keys}, self.lock)
        ahead = Ahead(window, self.lock)
        groups = []
        for k in self.keys:
            ahead.take(k)
            deferred = []
            made = ra.after(k, 0, ahead, deferred.append, lambda n, h: None, whole, region)
            groups.append((deferred, made))
        return groups, ahead

    def test_refills_in_larger_starts(self):
        groups, _ = self.loop(size=10, window=800)
        sizes = [len(d) for d, _ in groups[1:] if d]
        self.assertEqual(len(groups[0][0]), 80, "the first call fills the window")
        self.assertTrue(sizes, "nothing refilled")
        self.assertGreaterEqual(min(sizes[:-1]), 800 // REFILL // 10, sizes)
        self.assertLessEqual(len(sizes), 200 // (800 // REFILL // 10) + 1, "a start per get_tensor")

    def test_deferred_keys_are_held_for_their_tensors(self):
        narrow = lambda k: int(k[1:]) % 2 == 1  # noqa: E731
        groups, ahead = self.loop(size=10, window=100, whole=lambda k: not narrow(k),
                                  region=lambda k: 5 if narrow(k) else None)
        d, made = groups[0]
        self.assertTrue(all(not narrow(k) for k in d) and all(narrow(k) for k in made), (d, made))
        self.assertEqual((len(d), len(made)), (6, 7), "held at the region's bytes, not the tensor's")
        self.assertEqual({h.kind for h in ahead.held.values()} - {"ahead", "deferred"}, set())

    def test_a_key_without_a_guess_stops_it(self):
        groups, _ = self.loop(size=10, window=1000, whole=lambda k: k != "k005", region=lambda k: None)
        self.assertEqual(groups[0][0], ["k001", "k002", "k003", "k004"])
        self.assertEqual(groups[0][1], [])

    def test_moving_on_agrees_with_after(self):
        """get_tensor's per-call path (moved_on, then after() only where it
        says False) leaves the read-ahead as after() alone does, call by
        call: in order, passing keys over, out of order, to the end."""
        calls = self.keys[:50] + self.keys[60:70] + self.keys[65:66] + self.keys[70:]
        narrow = lambda k: int(k[1:]) % 3 == 1  # noqa: E731: held for a guessed region (hook_defer)
        stop = lambda k: k in ("k120", "k121")  # noqa: E731: no guess: the read-ahead stops there

        def run(fast: bool, deferring: bool):
            ra = ReadAhead(self.keys, {k: 10 for k in self.keys}, self.lock)
            ahead = Ahead(300, self.lock)
            whole = (lambda k: not narrow(k) and not stop(k)) if deferring else None
            region = (lambda k: None if stop(k) else 4) if deferring else None
            states, dropped, fast_calls = [], [], 0
            for k in calls:
                ahead.take(k)
                deferred: list = []
                made: list = []
                if fast and ra.moved_on(k, ahead):
                    fast_calls += 1
                else:
                    made = ra.after(k, 0, ahead, deferred.append, lambda n, h: dropped.append(n), whole, region)
                states.append((ra.expect, ra.ahead_to, list(ra.order), sorted(ahead.held), ahead.bytes, deferred,
                               made, list(dropped)))
            return states, fast_calls

        for deferring in (False, True):
            slow, _ = run(False, deferring)
            fast, n = run(True, deferring)
            self.assertGreater(n, len(calls) // 2, "the per-call path was rarely taken")
            for i, (a, b) in enumerate(zip(slow, fast)):
                self.assertEqual(a, b, f"deferring={deferring}: after call {i} ({calls[i]})")


if __name__ == "__main__":
    unittest.main()
