"""The hooked engines' loop on the emulated device, against the same bytes
read as one plan a file, in the same run (make bench-hook; root).

An engine loading its tensor-parallel rank asks safetensors for a slice of
every key in order (world 8, rank 7 here, on a two-file Llama-shaped
checkpoint: q/k/v/gate/up and the embeddings split on dim 0, o/down on dim
1, norms whole). With the hook on, those requests go through phxmount and
the hook guesses the slices to come. The baseline reads exactly the same
slices with no hook: one plan a file, every request started at once, the
same mount, readers and page cache (hot: each side runs several times
first). The ratio is what the hook's guessing, planning and waiting cost
over the bytes themselves.

Then vLLM's narrow loop (get_tensor, narrow to the rank, copy_ into the
rank's parameter) with get_tensor's deferral on, which needs torch: torch's
CPU tensors cut from one registered emu buffer stand in for GPU memory
(TorchArena), so deferred tensors, their in-place region reads and the
caller's copies run as on a GPU, over a small Llama of many tensors (a
CPU's torch copies strided columns far slower than a GPU's, so bytes are
kept few and the loop's cost is its cost per tensor, as the GPU loop's is).
The baseline reads the same slices as one plan a file and copies each into
the same parameters; every parameter is compared after the clock.

Then the engines' default loop (get_tensor of every key, whole) over a
MoE-shaped series of two files (one tensor per expert matrix, hundreds of
small tensors a file), against the same tensors read as one plan a file:
what a get_tensor costs over its bytes, per tensor (the hook's read-ahead,
hand-over and next-file start included).

The emulated device's memory is one memfd registered once, carved up per
request, standing in for torch's caching allocator (the tests' EmuBackend
registers every allocation, which would dominate). Not a GPU figure: the
GPU machine measures the loop against stock safetensors (gpu_tp.py).

    PHXMOUNT_BIN=bin/phxmount python3 python/tests/bench_hook_loop.py [--reps N]
"""

import argparse
import gc
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
import types
from unittest import mock

from mountutil import Mount, make_file, torch_or_none, why_not

from phxmount import abi, hook, hook_defer  # noqa: E402
from phxmount.availability import Availability, known  # noqa: E402
from phxmount.batchio import BatchIO  # noqa: E402
from phxmount.client import EmuBuffer  # noqa: E402
from phxmount.dtypes import torch_dtype  # noqa: E402
from phxmount.fetch import Fetcher  # noqa: E402
from phxmount.safeopen import SafeOpen  # noqa: E402
from phxmount.hostbackends import emu_alloc  # noqa: E402
from phxmount.regcache import cache_for  # noqa: E402
from phxmount.slicing import shard_index  # noqa: E402
from phxmount.stformat import DTYPE_SIZES, read_header  # noqa: E402
from phxmount.torch_mem import to_tensor  # noqa: E402

RANK, WORLD = 7, 8
DIM0 = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
        "embed_tokens.weight", "lm_head.weight")
DIM1 = ("o_proj.weight", "down_proj.weight")


def llama(hidden=1024, inter=2816, layers=12, vocab=4096):
    """(name, dtype, shape) of a small Llama's tensors."""
    specs = [("model.embed_tokens.weight", "BF16", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        specs += [(p + "self_attn.q_proj.weight", "BF16", (hidden, hidden)),
                  (p + "self_attn.k_proj.weight", "BF16", (hidden // 4, hidden)),
                  (p + "self_attn.v_proj.weight", "BF16", (hidden // 4, hidden)),
                  (p + "self_attn.o_proj.weight", "BF16", (hidden, hidden)),
                  (p + "mlp.gate_proj.weight", "BF16", (inter, hidden)),
                  (p + "mlp.up_proj.weight", "BF16", (inter, hidden)),
                  (p + "mlp.down_proj.weight", "BF16", (hidden, inter)),
                  (p + "input_layernorm.weight", "BF16", (hidden,)),
                  (p + "post_attention_layernorm.weight", "BF16", (hidden,))]
    return specs + [("model.norm.weight", "BF16", (hidden,)), ("lm_head.weight", "BF16", (vocab, hidden))]


def rank_index(name, shape):
    """The rank's index of a tensor, as an engine's loader takes it."""
    dim = 0 if name.endswith(DIM0) else 1 if name.endswith(DIM1) else None
    return shard_index(shape, dim, RANK, WORLD) if dim is not None and len(shape) == 2 else Ellipsis


class Pool:
    """Destinations carved out of one registered emu buffer, reused round
    robin (what the caching allocator's cached segments are to a load)."""

    def __init__(self, cache, buf: EmuBuffer):
        self.cache, self.buf, self.at = cache, buf, 0
        a = emu_alloc(buf)
        self.id, self.base = cache.locate(a, a.base, buf.size)

    def prepare(self, plans):
        pass

    def alloc(self, plan):
        n = -(-max(plan.read_bytes, 1) // 256) * 256
        if self.at + n > self.buf.size:
            self.at = 0
        at, self.at = self.at, self.at + n
        return at, plan.read_bytes

    def scratch(self, nbytes):
        return self.alloc(types.SimpleNamespace(read_bytes=nbytes))

    def locate(self, mem):
        return self.id, self.base + mem[0]

    def finish(self, mem, plan):
        return self.buf.view[mem[0]:mem[0] + mem[1]]

    def release(self, mem):
        pass


def no_stock(*a, **kw):
    raise AssertionError("the hook fell back to safetensors: the benchmark would time the stand-in")


class Bench:
    def __init__(self, files, pool_bytes=256 << 20):
        self.files = files
        self.buf = EmuBuffer(pool_bytes)
        self.fake = types.ModuleType("safetensors")
        self.fake.safe_open = no_stock
        self.saved = {k: sys.modules.get(k) for k in ("safetensors", "transformers")}
        sys.modules["safetensors"] = self.fake
        sys.modules["transformers"] = types.ModuleType("transformers")
        hook.report.__init__(io.StringIO())
        self.orig_open_reader = hook._open_reader
        hook._open_reader = self.open_reader

    def open_reader(self, path, dev, availability=None, header=None, fd=None):
        pool = Pool(cache_for(path, abi.VENDOR_EMU, 0), self.buf)
        return SafeOpen(Fetcher(path, pool, BatchIO(path, 4, fd=fd), header=header), availability)

    def fresh(self, loop):
        """loop(f) over every file (f: the hooked safe_open of it), hooked as
        a fresh process would run it: its seconds, each file opened and
        closed inside the clock. What the loop taught (guesses, roles,
        availability) is forgotten after it."""
        hook.install(hook.Mode(True, "cuda:0"))
        stands_in = Availability(True, "the emulated device stands in for cuda:0", on_mount=True, transport="staged")
        known._answers[(os.stat(self.files[0]).st_dev, 0)] = stands_in
        t0, c0 = time.perf_counter(), time.thread_time()
        for p in self.files:
            with self.fake.safe_open(p, "pt") as f:
                loop(f)
        secs = time.perf_counter() - t0
        self.cpu = time.thread_time() - c0  # the calling thread's CPU over the same span
        hook.closing.drain()
        hook.uninstall()
        known.forget()
        return secs

    def hooked(self):
        """One hooked get_slice loop: (seconds, [(name, seconds of its
        get_slice[...])])."""
        per = []

        def loop(f):
            for k in f.keys():
                s = f.get_slice(k)
                t = time.perf_counter()
                s[rank_index(k, tuple(s.get_shape()))]
                per.append((k, time.perf_counter() - t))
        return self.fresh(loop), per

    def engine(self):
        """One hooked engines' loop (get_tensor of every key in order): its seconds."""
        def loop(f):
            for k in f.keys():
                f.get_tensor(k)
        return self.fresh(loop)

    def bulk(self, index=None):
        """The same slices (index(name, shape); default the rank's), one
        plan a file started at once, no hook."""
        index = index or rank_index
        t0 = time.perf_counter()
        for p in self.files:
            r = self.open_reader(p, 0)
            ts = r.fetcher.header.tensors
            plans = [r.fetcher.plan(t.name, index(t.name, tuple(t.shape))) for t in ts]
            for x in r.fetcher.start(plans):
                x.result()
            r.close()
        return time.perf_counter() - t0

    def close(self):
        hook._open_reader = self.orig_open_reader
        for k, v in self.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        self.buf.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    why = why_not()
    if why:
        print(f"SKIP: {why}")
        return 0
    work = tempfile.mkdtemp(prefix="phxbench-hook-", dir="/var/tmp")
    backing = os.path.join(work, "backing")
    os.mkdir(backing)
    specs = llama()
    half = len(specs) // 2
    make_file(os.path.join(backing, "model-1.safetensors"), specs=specs[:half])
    make_file(os.path.join(backing, "model-2.safetensors"), specs=specs[half:])
    m = Mount(backing, staged=True, workers=2)
    b = None
    try:
        files = [m.path("model-1.safetensors"), m.path("model-2.safetensors")]
        b = Bench(files)
        for _ in range(3):  # the page cache, the planner's model, the threads: warm on both sides
            b.bulk(), b.hooked()
        bulk, loops = [], []
        for _ in range(args.reps):  # interleaved: the machine's noise falls on both sides
            bulk.append(b.bulk())
            loops.append(b.hooked())
        nb, nl = statistics.median(bulk), statistics.median(s for s, _ in loops)
        first = len(specs[:half])
        per = [sorted(x for _, x in p) for _, p in loops]
        served = statistics.median(statistics.median(p) for p in per)
        sums = [(sum(x for _, x in p[:first]), sum(x for _, x in p[first:])) for _, p in loops]
        waits = [(sum(x > 5e-4 for _, x in p[:first]), sum(x > 5e-4 for _, x in p[first:])) for _, p in loops]
        print(f"world {WORLD}, rank {RANK}, {len(specs)} tensors in 2 files, emulated staged device, hot, "
              f"medians of {args.reps}; on both sides each file's reader is opened and closed inside the clock, "
              f"the emulated memory registered once before it")
        print(f"  bulk (the rank's slices, one plan a file, no hook): {nb * 1e3:.1f} ms")
        print(f"  hooked engines' loop (get_slice in key order):     {nl * 1e3:.1f} ms = {nl / nb:.2f}x the bulk read")
        print(f"  first file's get_slice calls {statistics.median(s[0] for s in sums) * 1e3:.1f} ms "
              f"({statistics.median(w[0] for w in waits):.0f} over 0.5 ms), second file's "
              f"{statistics.median(s[1] for s in sums) * 1e3:.1f} ms ({statistics.median(w[1] for w in waits):.0f})")
        print(f"  a get_slice call, median: {served * 1e6:.0f} us")
        b.close()
        b = narrow_rows(backing, m, args.reps)
        if b is not None:
            b.close()
        b = engine_rows(backing, m, args.reps)
    finally:
        if b is not None:
            b.close()
        m.close()
        shutil.rmtree(work)
    return 0


def moe(layers=4, experts=32, hidden=256, inter=512):
    """(name, dtype, shape) of a MoE's expert matrices, one tensor each."""
    return [(f"model.layers.{i}.mlp.experts.{e}.{w}.weight", "BF16", shape)
            for i in range(layers) for e in range(experts)
            for w, shape in (("down_proj", (hidden, inter)), ("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)))]


def engine_rows(backing, m, reps):
    """The engines' loop over a two-file series against the bulk read of
    the same tensors, interleaved; prints the rows; returns its Bench."""
    specs = moe()
    half = len(specs) // 2
    names = ["moe-00001-of-00002.safetensors", "moe-00002-of-00002.safetensors"]
    make_file(os.path.join(backing, names[0]), seed=3, specs=specs[:half])
    make_file(os.path.join(backing, names[1]), seed=4, specs=specs[half:])
    b = Bench([m.path(n) for n in names])
    whole = lambda name, shape: None  # noqa: E731
    # An engine copies each tensor into its parameter, which teaches the
    # hook on a GPU that these roles are used whole (hook_defer); the
    # emulated device's results cannot be deferred, and a file that tries
    # reads one role's first tensor alone. Deferral off is what the GPU
    # loop gets after its first tensors.
    with mock.patch.dict(os.environ, {"PHXMOUNT_HOOK_DEFER": "0"}):
        for _ in range(3):
            b.bulk(whole), b.engine()
        bulk, loops = [], []
        for _ in range(reps):
            bulk.append(b.bulk(whole))
            loops.append(b.engine())
    nb, nl = statistics.median(bulk), statistics.median(loops)
    print(f"engines' loop: {len(specs)} expert tensors of {specs[0][2]} BF16 in 2 files (a series), "
          f"emulated staged device, hot, medians of {reps}; on both sides each file's reader is opened and "
          f"closed inside the clock, the emulated memory registered once before it")
    print(f"  bulk (every tensor, one plan a file, no hook): {nb * 1e3:.1f} ms")
    print(f"  hooked engines' loop (get_tensor in key order, roles used whole): {nl * 1e3:.1f} ms = {nl / nb:.2f}x the bulk read, "
          f"{(nl - nb) / len(specs) * 1e6:.0f} us a tensor over it")
    return b


class TorchArena(Pool):
    """The GPU backend's part with torch's CPU tensors standing in for
    device memory: Pool's round robin over its registered emu buffer, each
    piece a tensor (CudaBackend's allocations from torch's cached segments,
    located without asking the driver), so that get_tensor's deferral runs
    as on a GPU: deferred tensors over unread memory of their full shape,
    regions read into it in place, the caller's narrow and copy_ (Debian's
    torch)."""

    def __init__(self, torch, cache, buf: EmuBuffer):
        super().__init__(cache, buf)
        self.arena = torch.frombuffer(buf.map, dtype=torch.uint8, count=buf.size)
        # Every page touched once now: the round robin's first pass over
        # the memfd would otherwise fault its pages in inside the clock
        # (~40 ms a loop here), which a GPU's cached segments never do.
        self.arena.zero_()

    def take(self, nbytes: int):
        at, n = Pool.alloc(self, types.SimpleNamespace(read_bytes=nbytes))
        return self.arena[at:at + n]

    def tensor(self, shape, st_dtype: str):
        n = DTYPE_SIZES[st_dtype]
        for x in shape:
            n *= x
        return self.take(n).view(torch_dtype(st_dtype)).reshape(shape)

    def alloc(self, plan):
        if plan.trivial and plan.out_bytes == plan.read_bytes > 0:
            return self.tensor(plan.out_shape, plan.dtype)
        return self.scratch(plan.read_bytes)

    def scratch(self, nbytes):
        return self.take(nbytes)

    def locate(self, mem):
        return self.id, self.base + mem.data_ptr() - self.arena.data_ptr()

    def finish(self, mem, plan):
        return to_tensor(mem, plan)


class NarrowBench(Bench):
    """vLLM's narrow loop (get_tensor, narrow to the rank, copy_ into the
    rank's parameter) with the hook's deferral on, over TorchArena."""

    def __init__(self, files, torch, pool_bytes=1 << 30):
        super().__init__(files, pool_bytes)
        self.arena = TorchArena(torch, cache_for(files[0], abi.VENDOR_EMU, 0), self.buf)
        self.storage = mock.patch.object(hook_defer, "_storage", self.deferred_storage)
        self.storage.start()
        self.params = {}
        for p in files:
            for t in read_header(p).tensors:
                n = narrow_of(t.name, tuple(t.shape))
                shape = list(t.shape)
                if n is not None:
                    shape[n[0]] = n[2]
                self.params[t.name] = torch.empty(shape, dtype=torch_dtype(t.dtype))

    def deferred_storage(self, shape, st_dtype, dev):
        """hook_defer._storage's answer: (tensor, what the backend locates),
        the same tensor here, as on a GPU."""
        t = self.arena.tensor(shape, st_dtype)
        return t, t

    def open_reader(self, path, dev, availability=None, header=None, fd=None):
        return SafeOpen(Fetcher(path, self.arena, BatchIO(path, 4, fd=fd), header=header), availability)

    def narrow(self):
        """One hooked narrow loop: its seconds (the parameters hold what it
        copied; narrow_rows compares them after the clock)."""
        def loop(f):
            for k in f.keys():
                t = f.get_tensor(k)
                n = narrow_of(k, tuple(t.shape))
                self.params[k].copy_(t.narrow(*n) if n is not None else t)
        return self.fresh(loop)

    def bulk_copied(self):
        """The same slices read as one plan a file (no hook), each copied
        into its parameter as the loop's caller copies its narrow."""
        t0, c0 = time.perf_counter(), time.thread_time()
        for p in self.files:
            r = self.open_reader(p, 0)
            ts = r.fetcher.header.tensors
            plans = [r.fetcher.plan(t.name, rank_index(t.name, tuple(t.shape))) for t in ts]
            for t, x in zip(ts, r.fetcher.start(plans)):
                self.params[t.name].copy_(x.result())
            r.close()
        self.cpu = time.thread_time() - c0
        return time.perf_counter() - t0

    def close(self):
        self.storage.stop()
        super().close()


def narrow_of(name, shape):
    """(dim, start, length) of the rank's narrow, or None (used whole)."""
    idx = rank_index(name, shape)
    if idx is Ellipsis:
        return None
    d = len(idx) - 1
    return d, idx[d].start, idx[d].stop - idx[d].start


def narrow_rows(backing, m, reps):
    """vLLM's narrow loop with deferral over a two-file series of a small
    Llama (many tensors, few bytes each: a CPU's torch copies strided
    columns far slower than a GPU, so the tensors are kept small and the
    loop's cost is per tensor, as on the GPU), against the bulk read of the
    same slices copied into the same parameters, interleaved; prints the
    rows; returns its Bench."""
    torch = torch_or_none()
    if torch is None:
        print("vLLM's narrow loop: not run (torch is not importable: scripts/deps.sh installs python3-torch)")
        return None
    if not hasattr(torch.Tensor, "nbytes"):  # Debian's 1.13 predates it; the hook's report reads it
        torch.Tensor.nbytes = property(lambda t: t.numel() * t.element_size())
    specs = llama(hidden=256, inter=704, layers=24, vocab=2048)
    half = len(specs) // 2
    names = ["small-00001-of-00002.safetensors", "small-00002-of-00002.safetensors"]
    make_file(os.path.join(backing, names[0]), seed=5, specs=specs[:half])
    make_file(os.path.join(backing, names[1]), seed=6, specs=specs[half:])
    b = NarrowBench([m.path(n) for n in names], torch)
    for _ in range(3):
        b.bulk_copied(), b.narrow()
    want = {k: v.clone() for k, v in b.params.items()}  # what the bulk read put there
    bulk, loops, cpu_b, cpu_l = [], [], [], []
    for _ in range(reps):
        # A full cyclic collection over torch's objects (50-60 ms here) falls
        # in one loop of several otherwise; on the GPU machine a loop in a
        # fresh process made none (run 68): collected before each side.
        gc.collect()
        bulk.append(b.bulk_copied())
        cpu_b.append(b.cpu)
        for v in b.params.values():
            v.zero_()
        gc.collect()
        loops.append(b.narrow())
        cpu_l.append(b.cpu)
    bad = [k for k, v in b.params.items() if not torch.equal(v.view(torch.uint8), want[k].view(torch.uint8))]
    nb, nl = statistics.median(bulk), statistics.median(loops)
    cb, cl = statistics.median(cpu_b), statistics.median(cpu_l)
    n = len(b.params)
    print(f"vLLM's narrow loop: world {WORLD}, rank {RANK}, {n} tensors of a small Llama in 2 files (a series), "
          f"deferral on, torch's CPU tensors cut from one registered emu buffer standing in for GPU memory, hot, "
          f"medians of {reps}; on both sides each file's reader is opened and closed inside the clock")
    print(f"  bulk (the rank's slices, one plan a file, no hook, each copied into its parameter): {nb * 1e3:.1f} ms")
    print(f"  hooked narrow loop (get_tensor, narrow, copy_):                                 {nl * 1e3:.1f} ms = "
          f"{nl / nb:.2f}x the bulk read, {(nl - nb) / n * 1e6:.0f} us a tensor over it; "
          + ("every parameter equal to the bulk read's" if not bad else f"DIFFERENT: {bad[:3]}"))
    print(f"  the calling thread's CPU: bulk {cb * 1e3:.1f} ms, hooked {cl * 1e3:.1f} ms = {cl / cb:.2f}x, "
          f"{(cl - cb) / n * 1e6:.0f} us a tensor over it (the rest of the wall time: waits, for reads and for the "
          f"interpreter's lock)")
    return b


if __name__ == "__main__":
    sys.exit(main())
