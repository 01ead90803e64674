"""gpu_e2e section on saving (issue 9): save_safetensors of the file's
tensors (and a non-contiguous view) through the mount, with and without
fsync; safetensors.torch.load_file reads the result back equal, and so does
phxmount's own loader; the daemon's written-bytes counter matches."""

import os

import phxmount


def round_trip(c) -> None:
    import torch
    from safetensors.torch import load_file
    ref = c.ref()
    tensors = dict(ref)
    two = [k for k, v in ref.items() if v.dim() == 2 and v.shape[0] > 1]
    tensors["view.transposed"] = ref[two[0]][:, :64].t()  # not contiguous: saved as its values
    want = {k: v.contiguous() for k, v in tensors.items()}
    total = sum(v.numel() * v.element_size() for v in want.values())
    for fsync in (False, True):
        name = f"e2e-save-{'fsync' if fsync else 'nofsync'}.safetensors"
        c0 = c.counters()["ioctl_bytes_written"]
        s = phxmount.save_safetensors(tensors, os.path.join(c.mnt, name), metadata={"format": "pt", "by": "e2e"},
                                      fsync=fsync)
        written = c.counters()["ioctl_bytes_written"] - c0
        c.info(f"save_safetensors fsync={fsync}: {s.bytes / 1e9:.2f} GB in {s.seconds:.3f}s ({s.gbps:.2f} GB/s), "
               f"{s.extents} extents, {s.ioctls} ioctls, fsync {s.fsync_seconds:.3f}s")
        c.check(s.bytes == total and written == total,
                f"save fsync={fsync}: {written} bytes written through BATCH_WRITE for {total} bytes of tensors")
        back = load_file(os.path.join(c.backing, name), device="cuda:0")
        c.compare(back, want, f"save(fsync={fsync}) then safetensors.torch.load_file")
        del back
        mine = phxmount.load_safetensors(os.path.join(c.mnt, name), 0)
        torch.cuda.synchronize()
        c.compare(mine, want, f"save(fsync={fsync}) then phxmount.load_safetensors")
        with phxmount.safe_open(os.path.join(c.mnt, name), "pt", device="cuda:0") as f:
            c.check(f.metadata() == {"format": "pt", "by": "e2e"}, f"saved metadata read back: {f.metadata()}")
        del mine
        os.remove(os.path.join(c.backing, name))


SECTIONS = [("save round trips", round_trip, 240)]
