"""safe_open's engine (phxmount.fetch with the emu backend) on a real emu
mount, byte for byte against numpy: every tensor, random slices with each
strategy, one BATCH per request, prefetch, rank shards with the bytes
counter, the planner's measurement, and the pread fallback off the mount;
then rank shards (odd U8 widths from 1 byte) and random slices through
the staged transport, where the daemon gathers pieces from the page cache.
Needs root, /dev/fuse, bin/phxmount and numpy; skips saying which is
missing."""

import os
import random
import shutil
import threading
import unittest
from unittest import mock

from mountutil import SPECS, WHY_NO_NUMPY, MountedCase, as_array, make_file, np, same, why_not

from phxmount.client import PhxError  # noqa: E402
from phxmount import fetch, threadpools  # noqa: E402
from phxmount.fetch import select, stream  # noqa: E402
import phxmount  # noqa: E402
from phxmount.hostbackends import open_emu  # noqa: E402
from phxmount.slicing import random_index, shard_index  # noqa: E402

WHY = why_not() or WHY_NO_NUMPY


def delta(before, after):
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


@unittest.skipIf(WHY, f"SKIP: {WHY}")
class FetchEmuTest(MountedCase):
    @classmethod
    def populate(cls, backing):
        cls.header, ts = make_file(os.path.join(backing, "model.safetensors"), metadata={"format": "pt", "k": "v"})
        cls.arrays = {n: as_array(*v) for n, v in ts.items()}
        shutil.copy(os.path.join(backing, "model.safetensors"), os.path.join(backing, "copy.safetensors"))

    @property
    def path(self):
        return self.m.path("model.safetensors")

    def test_every_tensor(self):
        with open_emu(self.path) as f:
            self.assertEqual(f.keys(), sorted(self.arrays))
            self.assertEqual(f.metadata(), {"format": "pt", "k": "v"})
            for name, want in self.arrays.items():
                self.assertTrue(same(f.get_tensor(name), want), name)
                s = f.get_slice(name)
                self.assertEqual((s.get_shape(), s.get_dtype()), (list(want.shape), dict((n, d) for n, d, _ in SPECS)[name]))
            with self.assertRaises(KeyError):
                f.get_tensor("nope")

    def test_none_is_a_new_axis(self):
        # get_slice(k)[None] is torch's t[None] (and numpy's): a new leading
        # axis, not the whole tensor as it is.
        with open_emu(self.path) as f:
            for name in ("w1", "scalar"):
                got = f.get_slice(name)[None]
                self.assertTrue(same(got, self.arrays[name][None]), name)
                self.assertEqual(tuple(got.shape), (1,) + self.arrays[name].shape)

    def test_random_slices_every_strategy(self):
        rng = random.Random(11)
        names = [n for n, a in self.arrays.items() if a.ndim]
        for strategy, count in (("auto", 200), ("exact", 60), ("cover", 60)):
            with open_emu(self.path, strategy=strategy) as f:
                for _ in range(count):
                    name = rng.choice(names)
                    idx = random_index(rng, self.arrays[name].shape)
                    got = f.get_slice(name)[idx]
                    self.assertTrue(same(got, self.arrays[name][idx]), (strategy, name, idx))

    def test_one_request_is_one_batch_of_exactly_its_extents(self):
        with open_emu(self.path, strategy="exact") as f:
            f.get_tensor("odd")  # the first call opens the I/O descriptors
            # A column of every row is one strided extent.
            for idx, extents, nbytes in (((slice(3, 9),), 1, 6 * 257 * 4), ((slice(None), slice(3, 9)), 1, 129 * 6 * 4)):
                c0 = self.counters()
                got = f.get_slice("w1")[idx]
                d = delta(c0, self.counters())
                self.assertTrue(same(got, self.arrays["w1"][idx]))
                self.assertEqual((d.get("lib_batches"), d.get("ioctl_extents"), d.get("ioctl_bytes_read")),
                                 (1, extents, nbytes), idx)

    def test_prefetch_is_served_from_what_landed(self):
        items = ["embed", "cube", ("w1", (slice(None), slice(0, 100, 3))), ("wide", (Ellipsis, 5)), ("none", None)]
        with open_emu(self.path) as f:
            f.prefetch(items)
            f.wait_prefetched()
            c0 = self.counters()
            got = [f.get_tensor(it) if isinstance(it, str) else f.get_slice(it[0])[it[1] if it[1] is not None else ()]
                   for it in items]
            d = delta(c0, self.counters())
            self.assertEqual(f.served_from_prefetch, len(items))
        self.assertNotIn("ioctl_extents", d, "a prefetched request was read again")
        for it, g in zip(items, got):
            name, idx = (it, ()) if isinstance(it, str) else (it[0], it[1] or ())
            self.assertTrue(same(g, self.arrays[name][idx]), it)

    def test_prefetch_in_tasks_of_flush_bytes(self):
        # One task (one BATCH here) for the lot by default; a task about
        # every flush_bytes when asked, so the first plans land first.
        names = ["embed", "w1", "bias", "w2", "wide"]
        for flush, tasks in ((None, 1), (1, len(names))):
            with open_emu(self.path) as f:
                plans = [f.fetcher.plan(n) for n in names]
                b0 = self.counters()["lib_batches"]
                f.prefetch_planned(plans, flush_bytes=flush)
                f.wait_prefetched()
                self.assertEqual(self.counters()["lib_batches"] - b0, tasks, flush)
                for n in names:
                    self.assertTrue(same(f.get_tensor(n), self.arrays[n]), (n, flush))
                self.assertEqual(f.served_from_prefetch, len(names))

    def test_in_place_reads_land_at_their_own_offsets(self):
        # read_in_place into memory of the whole tensor's layout: the
        # selection's bytes (and a covering read's others) at their own
        # offsets, nothing else written, urgent or queued; each Pending's
        # result is the memory given.
        from phxmount.client import EmuBuffer
        rng = random.Random(11)
        with open_emu(self.path) as f:
            self.assertIs(f.fetcher.plan("w1"), f.fetcher.plan("w1"), "a whole tensor's plan is made once")
            for name in ("w1", "wide", "cube"):
                a = self.arrays[name]
                raw = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
                for k in range(12):
                    index = random_index(rng, a.shape)
                    try:
                        want = a[index]
                    except (IndexError, ValueError):
                        continue
                    for strategy in ("exact", "cover"):
                        buf = EmuBuffer(raw.size)
                        buf.view[:raw.size] = b"\xee" * raw.size
                        p = f.fetcher.plan(name, index, in_place=True, strategy=strategy)
                        (pend,) = f.read_in_place([p], [buf], urgent=k % 2 == 0)
                        self.assertIs(pend.result(), buf)
                        got = np.frombuffer(bytes(buf.view[:raw.size]), dtype=np.uint8)
                        written = got != 0xEE
                        self.assertTrue((got[written] == raw[written]).all(), (name, index, strategy))
                        view = got.view(a.dtype).reshape(a.shape)
                        self.assertTrue(same(view[index], want), (name, index, strategy))
                        buf.close()

    def test_rank_shards(self):
        for dim in (0, 1):
            for world in (2, 4, 8):
                for rank in range(world):
                    self.check_shard(dim, rank, world)

    def check_shard(self, dim, rank, world):
        with open_emu(self.path) as f:
            f.get_tensor("odd")
            c0 = self.counters()
            plans = select(f.fetcher, shard=(dim, rank, world))
            got = {p.name: x.result() for p, x in zip(plans, f.fetcher.start(plans))}
            d = delta(c0, self.counters())
        nbytes = 0
        for name, a in self.arrays.items():
            idx = shard_index(a.shape, dim, rank, world)
            want = a if idx is None else np.array_split(a, world, axis=dim)[rank]
            self.assertTrue(same(got[name], want), (name, dim, rank, world))
            nbytes += want.nbytes
        if dim == 0:  # row shards read exactly their bytes
            self.assertEqual(d.get("ioctl_bytes_read", 0), nbytes, (rank, world))
        self.assertEqual(sorted(got), sorted(self.arrays))

    def test_the_planner_measures_once_per_mount(self):
        fetch._costs.pop((os.stat(self.path).st_dev, "mount"), None)  # an earlier mount's, on a reused st_dev
        idx = (slice(None), slice(0, 1000))
        with open_emu(self.path) as f:
            b0 = self.counters()["lib_batches"]
            p = f.explain("wide", idx)
            self.assertGreater(self.counters()["lib_batches"] - b0, 0, "no measurement")
            self.assertTrue(f.fetcher.cost.source.startswith("measured: "), f.fetcher.cost.source)
            self.assertIn("model.safetensors: wide", f.fetcher.cost.source)
            self.assertIn("exact: 16 extent(s) of 1000 B", p.why)
            self.assertIn("whole rows then slice on the device", p.why)
            self.assertTrue(same(f.get_slice("wide")[:, :1000], self.arrays["wide"][:, :1000]))
            model = f.fetcher.cost
        # Another file of the mount: its first request is its own BATCH alone.
        with open_emu(self.m.path("copy.safetensors")) as g:
            self.assertIs(g.fetcher.cost, model)
            b0 = self.counters()["lib_batches"]
            self.assertTrue(same(g.get_slice("wide")[idx], self.arrays["wide"][idx]))
            self.assertEqual(self.counters()["lib_batches"] - b0, 1)
            self.assertEqual(g.explain("wide", idx).why, p.why)

    def test_fetchers_of_one_mount_measure_once(self):
        # A rank's files opened together and asked at once from threads:
        # one measurement, which every fetcher of the mount then plans with.
        fetch._costs.pop((os.stat(self.path).st_dev, "mount"), None)
        idx = (slice(None), slice(0, 1000))
        real = fetch.Fetcher.calibrate
        with open_emu(self.path) as f, open_emu(self.m.path("copy.safetensors")) as g, \
                mock.patch.object(fetch.Fetcher, "calibrate", autospec=True, side_effect=real) as measured:
            self.assertFalse(f.fetcher.cost.source.startswith("measured"))
            both = threading.Barrier(2)
            got, errs = {}, []

            def ask(x):
                try:
                    both.wait()
                    got[x] = x.get_slice("wide")[idx]
                except Exception as e:  # noqa: BLE001
                    errs.append(e)
            ts = [threading.Thread(target=ask, args=(x,)) for x in (f, g)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            self.assertEqual(errs, [])
            self.assertEqual(measured.call_count, 1)
            self.assertIs(f.fetcher.cost, g.fetcher.cost)
            self.assertTrue(g.fetcher.cost.source.startswith("measured: "), g.fetcher.cost.source)
            for x in (f, g):
                self.assertTrue(same(got[x], self.arrays["wide"][idx]))

    def test_a_measurement_started_at_open_serves_the_first_column_plan(self):
        # The hook's reader asks for the model at its open (measure_soon):
        # a chore thread measures, and the first column slice plans with
        # it, measuring nothing on the caller's thread.
        fetch._costs.pop((os.stat(self.path).st_dev, "mount"), None)
        idx = (slice(None), slice(0, 1000))
        real = fetch.Fetcher.calibrate
        with open_emu(self.path) as f, \
                mock.patch.object(fetch.Fetcher, "calibrate", autospec=True, side_effect=real) as measured:
            self.assertTrue(f.fetcher.measure_soon())
            self.assertFalse(f.fetcher.measure_soon())  # under way or made: once
            self.assertTrue(threadpools.drain(30))
            self.assertEqual(measured.call_count, 1)
            self.assertTrue(f.fetcher.cost.source.startswith("measured: "), f.fetcher.cost.source)
            self.assertTrue(same(f.get_slice("wide")[idx], self.arrays["wide"][idx]))
            self.assertIn("whole rows then slice on the device", f.explain("wide", idx).why)
            self.assertEqual(measured.call_count, 1)
            self.assertFalse(f.fetcher.measure_soon())

    def test_a_plan_waits_for_the_measurement_under_way(self):
        fetch._costs.pop((os.stat(self.path).st_dev, "mount"), None)
        idx = (slice(None), slice(0, 1000))
        gate, started = threading.Event(), threading.Event()
        real_any = fetch.Fetcher._measure_any
        real = fetch.Fetcher.calibrate

        def slow_measure(fetcher):
            started.set()
            gate.wait(10)
            return real_any(fetcher)
        with open_emu(self.path) as f, \
                mock.patch.object(fetch.Fetcher, "_measure_any", autospec=True, side_effect=slow_measure), \
                mock.patch.object(fetch.Fetcher, "calibrate", autospec=True, side_effect=real) as measured:
            self.assertTrue(f.fetcher.measure_soon())
            self.assertTrue(started.wait(10))
            planned = []
            t = threading.Thread(target=lambda: planned.append(f.fetcher.plan("wide", idx)))
            t.start()
            t.join(0.2)
            self.assertTrue(t.is_alive(), "the plan did not wait for the measurement under way")
            gate.set()
            t.join(10)
            self.assertFalse(t.is_alive())
            self.assertTrue(threadpools.drain(30))
            self.assertEqual(measured.call_count, 1)
            self.assertTrue(f.fetcher.cost.source.startswith("measured: "))
            self.assertEqual(planned[0].why, f.explain("wide", idx).why)

    def test_stream_goes_in_tasks(self):
        # Everything inside the window starts at once, in tasks of
        # IN_ORDER_TASK bytes: at 1 byte, one BATCH a tensor.
        names = ["embed", "w1", "bias", "w2", "wide"]
        with open_emu(self.path) as f, mock.patch.object(fetch, "IN_ORDER_TASK", 1):
            plans = [f.fetcher.plan(n) for n in names]
            b0 = self.counters()["lib_batches"]
            got = dict(stream(f.fetcher, plans, window=1 << 30))
            self.assertEqual(self.counters()["lib_batches"] - b0, len(names))
        for n in names:
            self.assertTrue(same(got[n], self.arrays[n]), n)

    def test_stream_in_order(self):
        with open_emu(self.path) as f:
            plans = select(f.fetcher, names=lambda n: n != "odd", shard=(1, 1, 3))
            got = list(stream(f.fetcher, plans, window=4096))
        self.assertEqual([n for n, _ in got], [t.name for t in self.header.tensors if t.name != "odd"])
        for name, a in got:
            idx = shard_index(self.arrays[name].shape, 1, 1, 3)
            self.assertTrue(same(a, self.arrays[name][idx or ()]), name)

    def test_pread_off_the_mount_says_so(self):
        off = os.path.join(self.m.backing, "model.safetensors")
        with phxmount.safe_open(off, framework="np") as f:  # no torch needed for numpy
            av = f.available()
            self.assertFalse(av.ok)
            self.assertIn("not on a phxmount mount", av.reason)
            self.assertIn("reading with pread into host memory", str(av))
            self.assertTrue(same(f.get_slice("cube")[1:, ::2, -3], self.arrays["cube"][1:, ::2, -3]))
            self.assertEqual(f.fetcher.io.kind, "pread")

    def test_a_short_file_names_the_tensor(self):
        src = os.path.join(self.m.backing, "model.safetensors")
        cut = os.path.join(self.m.backing, "cut.safetensors")
        shutil.copy(src, cut)
        try:
            with open_emu(self.m.path("cut.safetensors")) as f:
                os.truncate(cut, os.path.getsize(cut) - 100)
                with self.assertRaises(PhxError) as e:
                    f.get_tensor("wide")
            self.assertIn("wide", str(e.exception))
        finally:
            os.remove(cut)


class FetchEmuStagedTest(FetchEmuTest):
    staged = True


if __name__ == "__main__":
    unittest.main()


@unittest.skipIf(WHY, f"SKIP: {WHY}")
class FetchEmuStagedTest(MountedCase):
    """The same against the staged transport, where the daemon gathers
    small pieces of a hot file from its mapping: rank shards on both dims
    (U8 columns of every odd width from 1 byte up included) and random
    slices, byte for byte against numpy, with the gathers counted."""

    staged = True

    @classmethod
    def populate(cls, backing):
        specs = SPECS + [(f"u8x{w}", "U8", (64, w)) for w in (1, 3, 5, 7, 13, 31, 257)]
        cls.header, ts = make_file(os.path.join(backing, "model.safetensors"), specs=specs)
        cls.arrays = {n: as_array(*v) for n, v in ts.items()}

    def test_rank_shards_and_odd_widths(self):
        path = self.m.path("model.safetensors")
        with open(path, "rb") as warm:  # hot: the daemon gathers only what the page cache holds
            warm.read()
        g0 = self.gathered(path)
        for dim in (0, 1):
            for world in (2, 3, 8):
                for rank in (0, world // 2, world - 1):
                    with open_emu(path) as f:
                        plans = select(f.fetcher, shard=(dim, rank, world))
                        got = {p.name: x.result() for p, x in zip(plans, f.fetcher.start(plans))}
                    for name, a in self.arrays.items():
                        idx = shard_index(a.shape, dim, rank, world)
                        want = a if idx is None else np.array_split(a, world, axis=dim)[rank]
                        self.assertTrue(same(got[name], want), (name, dim, rank, world))
        self.assertGreater(self.gathered(path) - g0, 0, "nothing was gathered")

    @staticmethod
    def gathered(path):
        info = os.getxattr(path, "user.phx.info").decode()
        return int(dict(line.split("=", 1) for line in info.splitlines())["staged_gathered_reads"])

    def test_random_slices(self):
        rng = random.Random(5)
        names = [n for n, a in self.arrays.items() if a.ndim]
        with open_emu(self.m.path("model.safetensors"), strategy="exact") as f:
            for _ in range(150):
                name = rng.choice(names)
                idx = random_index(rng, self.arrays[name].shape)
                self.assertTrue(same(f.get_slice(name)[idx], self.arrays[name][idx]), (name, idx))
