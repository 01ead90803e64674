"""gpu_e2e sections on reading (issue 15): phxmount.safe_open against
safetensors.safe_open (every tensor; keys, metadata, shapes, dtypes),
random slices against safetensors' get_slice with each strategy, prefetch
served from what landed, the pread fallback off the mount saying so, and
iter_tensors over the file and the sharded checkpoint."""

import os
import random
import warnings
from collections import Counter

import phxmount
from phxmount.stformat import read_header
from phxmount.slicing import random_index, shard_index

EXACT_MAX = 200_000  # a forced exact plan with more extents is skipped (it would take minutes)


def st_open(c):
    from safetensors import safe_open
    return safe_open(c.backing_file, framework="pt", device="cuda:0")


def same(m, r) -> bool:
    import torch
    return m.dtype == r.dtype and tuple(m.shape) == tuple(r.shape) and m.device == r.device and torch.equal(m, r)


def every_tensor(c) -> None:
    with phxmount.safe_open(c.mount_file, "pt", device="cuda:0") as f, st_open(c) as g:
        c.check(sorted(f.keys()) == sorted(g.keys()), f"safe_open keys(): {len(f.keys())} names as safetensors'")
        c.check(f.metadata() == g.metadata(), f"safe_open metadata(): {f.metadata()}")
        bad = []
        for k in g.keys():
            s, t = f.get_slice(k), g.get_slice(k)
            if (s.get_shape(), s.get_dtype()) != (list(t.get_shape()), t.get_dtype()):
                bad.append(f"{k}: get_shape/get_dtype {s.get_shape(), s.get_dtype()} vs {t.get_shape(), t.get_dtype()}")
            elif not same(f.get_tensor(k), g.get_tensor(k)):
                bad.append(f"{k}: get_tensor differs")
        n = len(g.keys())
    c.check(not bad, f"safe_open.get_tensor vs safetensors.safe_open.get_tensor: {n - len(bad)}/{n} equal"
            + ("" if not bad else "; " + "; ".join(bad[:5])))


def cases(rng, shapes, n):
    """n indices: a quarter row slices, a quarter column slices, a quarter
    strided (steps on both dimensions), the rest random_index on any
    tensor (ints, negative bounds, Ellipsis, None)."""
    two = [k for k, s in shapes.items() if len(s) == 2 and s[0] > 1]
    out = []
    for i in range(n):
        k = rng.choice(two if i < 3 * n // 4 else sorted(shapes))
        s = shapes[k]
        if i < n // 4:
            lo = rng.randrange(s[0])
            idx = (slice(lo, rng.randrange(lo, s[0] + 1)),)
        elif i < n // 2:
            lo = rng.randrange(s[1])
            idx = (slice(None), slice(lo, rng.randrange(lo, s[1] + 1)))
        elif i < 3 * n // 4:
            idx = (slice(rng.randrange(4), None, rng.choice((2, 3, 8))), slice(None, None, rng.choice((1, 2, 16))))
        else:
            idx = random_index(rng, s)
        out.append((k, idx))
    return out


def slices_with(c, g, strategy, todo) -> None:
    with phxmount.safe_open(c.mount_file, "pt", device="cuda:0", strategy=strategy) as f:
        bad, done, skipped = [], 0, 0
        for k, idx in todo:
            if strategy == "exact" and f.explain(k, idx).extents > EXACT_MAX:
                skipped += 1
                continue
            m, r = f.get_slice(k)[idx], g.get_slice(k)[idx]
            done += 1
            if not same(m, r):
                bad.append(f"{k}[{idx}]: {tuple(m.shape)} {m.dtype} vs {tuple(r.shape)} {r.dtype}")
        kinds = dict(Counter(p.strategy for p in f.fetcher.plans))
        c.check(not bad and done, f"{done} slices, strategy {strategy}, vs safetensors get_slice: {done - len(bad)} equal"
                f" (skipped {skipped} exact plans of > {EXACT_MAX} extents); plans {kinds}; cost model: "
                f"{f.fetcher.cost.source}" + ("" if not bad else "; " + "; ".join(bad[:3])))
        why = [p.why for p in f.fetcher.plans if p.strategy == "cover"][:1]
        if why:
            c.info(f"a covering plan: {why[0]}")


def random_slices(c) -> None:
    shapes = {t.name: t.shape for t in read_header(c.backing_file).tensors}
    todo = cases(random.Random(15), shapes, c.a.slices)
    q = len(todo) // 4
    with st_open(c) as g:
        slices_with(c, g, "auto", todo)
        slices_with(c, g, "exact", todo[q:q + 40] + todo[2 * q:2 * q + 20])
        slices_with(c, g, "cover", todo[q:q + 40] + todo[2 * q:2 * q + 20])


def prefetch(c) -> None:
    ref = c.ref()
    names = sorted(ref)
    sl = [(k, (slice(None), slice(0, 64))) for k in names if ref[k].dim() == 2][:5]
    with phxmount.safe_open(c.mount_file, "pt", device="cuda:0") as f:
        f.prefetch(names + sl)
        f.wait_prefetched()
        c0 = c.counters()
        got = {k: f.get_tensor(k) for k in names}
        got_sl = [f.get_slice(k)[idx] for k, idx in sl]
        moved = c.counters()["ioctl_extents"] - c0["ioctl_extents"]
        served = f.served_from_prefetch
    c.check(moved == 0 and served == len(names) + len(sl),
            f"prefetch of {len(names)} tensors and {len(sl)} slices: later get_* served from what landed "
            f"({served} served, {moved} extents moved after the prefetch)")
    c.compare(got, ref, "prefetched tensors vs safetensors")
    c.check(all(same(m, ref[k][idx]) for m, (k, idx) in zip(got_sl, sl)), "prefetched slices vs safetensors")


def fallback(c) -> None:
    ref = c.ref()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f = phxmount.safe_open(c.backing_file, "pt", device="cuda:0")
    warned = [x for x in w if issubclass(x.category, phxmount.PhxFallbackWarning)]
    with f:
        av = f.available()
        c.check(warned and not av.ok and "not on a phxmount mount" in av.reason and "pinned" in av.fallback,
                f"safe_open off the mount warns and says so: {av}")
        ks = [k for k in sorted(ref) if ref[k].dim() == 2][:3]
        ok = all(same(f.get_tensor(k), ref[k]) and same(f.get_slice(k)[1:9, ::5], ref[k][1:9, ::5]) for k in ks)
        c.check(ok and f.fetcher.io.kind == "pread", f"the pread fallback's tensors and slices equal safetensors' ({ks})")


def iterate(c) -> None:
    ref = c.ref()
    order = [t.name for t in read_header(c.backing_file).tensors]
    got = list(phxmount.iter_tensors(c.mount_file, 0, shard=(0, 1, 4), window_bytes=512 << 20))
    c.check([k for k, _ in got] == order, "iter_tensors yields the file's tensors in data order")
    want = {k: ref[k][shard_index(ref[k].shape, 0, 1, 4) or ()] for k in order}
    c.compare(dict(got), want, "iter_tensors(shard=(0, 1, 4)) vs safetensors")
    if c.a.shard_dir:
        d = os.path.join(c.mnt, c.a.shard_dir)
        names = [k for k, _ in phxmount.iter_tensors(d, 0)][::2]
        got = dict(phxmount.iter_tensors(d, 0, names=names))
        c.check(sorted(got) == sorted(names), f"iter_tensors over the sharded checkpoint, {len(names)} names kept")


SECTIONS = [("safe_open, every tensor", every_tensor, 180), ("random slices", random_slices, 400),
            ("prefetch", prefetch, 120), ("pread fallback", fallback, 120), ("iter_tensors", iterate, 120)]
