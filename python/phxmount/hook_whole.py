"""load_file's read through the hook: every tensor of a file nothing was
read of yet, in one start (hook.HookedFile.get_tensors), or the start a
warm file made (hook_next). No torch."""

from __future__ import annotations

from typing import Callable, List, Optional

from .hook_report import report


def start_whole(f, dev: int, names: List[str]) -> list:
    """Starts names of hooked file f onto dev, in one start; their Pendings."""
    report.asked()
    reader = f._reader(dev)
    plans = [reader.fetcher.plan(n) for n in names]
    with f._lock:
        f._starts.started.setdefault(dev, set()).update(names)
    report.started()
    return reader.read(plans, flush_bytes=f.task or reader.fetcher.in_order_task)


def read_whole(f, dev: int, names: List[str], pends: Optional[list] = None,
               then: Optional[Callable[[], None]] = None) -> dict:
    """names of hooked file f onto dev: one start of all of them (pends:
    started already, a warm file's: hook_next), each result taken from its
    own request, with none of a single request's bookkeeping (its
    read-ahead, guesses and hand-over: a MoE file's thousands of tensors
    paid it each); then() runs once they started (the next file's start).
    Where phxmount fails, f falls back and the real safetensors reads the
    rest."""
    try:
        if pends is None:
            pends = start_whole(f, dev, names)
    except Exception as e:  # noqa: BLE001: never fail where safetensors works
        f._fall_back(e)
        return {n: f._stock_to(f.tensors[n], None, dev) for n in names}
    if then is not None:
        then()
    out, nbytes, landed, at = {}, 0, 0, None
    for i, (n, pend) in enumerate(zip(names, pends)):
        try:
            out[n] = pend.result()
        except Exception as e:  # noqa: BLE001
            f._fall_back(e)
            out.update((m, f._stock_to(f.tensors[m], None, dev)) for m in names[i:])
            break
        nbytes, landed, at = nbytes + pend.plan.read_bytes, landed + 1, max(at or 0.0, pend.landed_at)
    report.landed(dev, nbytes, landed, at=at)
    return out
