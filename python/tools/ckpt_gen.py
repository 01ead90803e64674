"""Checkpoints in the shapes users load (issue 27), generated fast on the GPU
machine and kept for the session:

* moe: a Qwen3-MoE checkpoint in the hub's per-expert layout: one tensor
  per expert matrix (model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight)
  as the hub's Qwen3-MoE files have, router, attention with q/k norms,
  untied lm_head (2,013 tensors, 7.7 GB, 4 files);
* dense20: a Llama checkpoint of 21.3 GB in 11 files (hidden 4096, MLP
  14336, 32/8 heads, 44 layers, vocab 128256);
* qwen2: a Qwen2 model with q/k/v biases, tied embeddings (no lm_head in
  the file) and its norms stored as F32 in a BF16 checkpoint (4.6 GB, 3
  files; 32 heads and 4 KV heads, so worlds above 4 replicate KV heads);
* kv: 2 GiB of random bytes (the KV blocks' file).

Each is written as save_pretrained writes one: config.json, files
model-0000i-of-0000n.safetensors of at most MAX_SHARD bytes ("format": "pt"
metadata), model.safetensors.index.json with the weight map; tensors in
the model's order. The bytes are random with bit 14 of every 16-bit word
cleared, so every BF16, F16 and F32 value is finite (no NaN a comparison
would trip on) and every tensor's bytes differ from every other's. On a
GPU they are drawn there (torch) and written from pinned memory, a file
per thread; without one, os.urandom. --quick gives the same kinds at a
fraction of the size (1,611 tensors in the MoE still).

A checkpoint lives in ROOT/NAME-KEY, KEY a hash of everything that decides
its bytes' shape (kind, sizes, shards, this generator's version), and is
kept once complete (the file DONE, written last): a second call of one
session finds it and writes nothing.

    ckpt_gen.py gen --root DIR [--quick] [--only moe,dense20,qwen2,kv] [--cpu] [--sync]
    ckpt_gen.py plan [--quick]            names, tensors, bytes, files; no I/O
    ckpt_gen.py need --root DIR [--quick] bytes the disk must still take (what is not
                                          there yet, the KV write file included)
    ckpt_gen.py prune --root DIR          removes the checkpoints of other keys (an older
                                          layout, the other size) under DIR
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import DTYPE_SIZES, encode_header, say  # noqa: E402

VERSION = 1  # of the layouts and the filling below: part of every key
MAX_SHARD = 2_000_000_000  # bytes a file holds at most (save_pretrained's max_shard_size="2GB")
MASK16 = 0xBFFF  # bit 14 of every 16-bit word cleared: BF16/F16/F32 stay finite
CHUNK = 128 << 20  # bytes drawn and written at a time
DONE = "DONE"
NAMES = ("moe", "dense20", "qwen2", "kv")
KV_WRITE_FILE = "kv-write.bin"  # gpu_kv.py's write file beside kv.bin, the read file's size

FULL = {
    "moe": {"kind": "qwen3_moe", "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "experts": 64,
            "moe_inter": 768, "top_k": 8, "layers": 10, "vocab": 151936},
    "dense20": {"kind": "llama", "hidden": 4096, "inter": 14336, "heads": 32, "kv_heads": 8, "layers": 44,
                "vocab": 128256},
    "qwen2": {"kind": "qwen2", "hidden": 4096, "inter": 14336, "heads": 32, "kv_heads": 4, "layers": 8,
              "vocab": 152064},
    "kv": {"kind": "raw", "bytes": 2 << 30},
}
QUICK = {
    "moe": {"kind": "qwen3_moe", "hidden": 512, "heads": 8, "kv_heads": 2, "head_dim": 64, "experts": 64,
            "moe_inter": 256, "top_k": 4, "layers": 8, "vocab": 32000, "max_shard": 200_000_000},
    "dense20": {"kind": "llama", "hidden": 2048, "inter": 5632, "heads": 16, "kv_heads": 4, "layers": 10,
                "vocab": 32000, "max_shard": 128_000_000},
    "qwen2": {"kind": "qwen2", "hidden": 1024, "inter": 2816, "heads": 16, "kv_heads": 2, "layers": 4,
              "vocab": 32000, "max_shard": 100_000_000},
    "kv": {"kind": "raw", "bytes": 256 << 20},
}


# --- the layouts: (name, dtype, shape) in the model's order ----------------------------

def _attn(p, c, bias=False, qk_norm=False):
    hd = c.get("head_dim") or c["hidden"] // c["heads"]
    q, kv = c["heads"] * hd, c["kv_heads"] * hd
    out = [(p + "self_attn.q_proj.weight", "BF16", (q, c["hidden"]))]
    out += [(p + "self_attn.q_proj.bias", "BF16", (q,))] if bias else []
    out += [(p + "self_attn.k_proj.weight", "BF16", (kv, c["hidden"]))]
    out += [(p + "self_attn.k_proj.bias", "BF16", (kv,))] if bias else []
    out += [(p + "self_attn.v_proj.weight", "BF16", (kv, c["hidden"]))]
    out += [(p + "self_attn.v_proj.bias", "BF16", (kv,))] if bias else []
    out += [(p + "self_attn.o_proj.weight", "BF16", (c["hidden"], q))]
    if qk_norm:
        out += [(p + "self_attn.q_norm.weight", "BF16", (hd,)), (p + "self_attn.k_norm.weight", "BF16", (hd,))]
    return out


def _mlp(p, hidden, inter):
    return [(p + "gate_proj.weight", "BF16", (inter, hidden)), (p + "up_proj.weight", "BF16", (inter, hidden)),
            (p + "down_proj.weight", "BF16", (hidden, inter))]


def tensors(c: dict) -> list:
    """The checkpoint's tensors as the hub's files of that architecture
    name and shape them."""
    kind, h = c["kind"], c.get("hidden")
    if kind == "raw":
        return []
    norm = "F32" if kind == "qwen2" else "BF16"  # qwen2: the fp32 tensors of a bf16 file
    out = [("model.embed_tokens.weight", "BF16", (c["vocab"], h))]
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        out += _attn(p, c, bias=kind == "qwen2", qk_norm=kind == "qwen3_moe")
        if kind == "qwen3_moe":
            out += [(p + "mlp.gate.weight", "BF16", (c["experts"], h))]
            for e in range(c["experts"]):
                out += _mlp(f"{p}mlp.experts.{e}.", h, c["moe_inter"])
        else:
            out += _mlp(p + "mlp.", h, c["inter"])
        out += [(p + "input_layernorm.weight", norm, (h,)), (p + "post_attention_layernorm.weight", norm, (h,))]
    out += [("model.norm.weight", norm, (h,))]
    if kind != "qwen2":  # qwen2's embeddings are tied: no lm_head in the file
        out += [("lm_head.weight", "BF16", (c["vocab"], h))]
    return out


def nbytes(t) -> int:
    n = DTYPE_SIZES[t[1]]
    for x in t[2]:
        n *= x
    return n


def shards(ts: list, max_bytes: int) -> list:
    """save_pretrained's split: tensors in order, a new file when the next
    one would take the current past max_bytes."""
    out, cur, size = [], [], 0
    for t in ts:
        b = nbytes(t)
        if cur and size + b > max_bytes:
            out.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += b
    return out + ([cur] if cur else [])


def config_json(c: dict) -> dict:
    """config.json as transformers reads it for the architecture."""
    base = {"hidden_size": c["hidden"], "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"],
            "num_key_value_heads": c["kv_heads"], "vocab_size": c["vocab"], "torch_dtype": "bfloat16",
            "dtype": "bfloat16", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "use_cache": True}
    if c["kind"] == "llama":
        return dict(base, model_type="llama", architectures=["LlamaForCausalLM"], intermediate_size=c["inter"],
                    tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    if c["kind"] == "qwen2":
        return dict(base, model_type="qwen2", architectures=["Qwen2ForCausalLM"], intermediate_size=c["inter"],
                    tie_word_embeddings=True, use_sliding_window=False, sliding_window=None, max_window_layers=0)
    if c["kind"] == "qwen3_moe":
        return dict(base, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], head_dim=c["head_dim"],
                    intermediate_size=4 * c["moe_inter"], moe_intermediate_size=c["moe_inter"],
                    num_experts=c["experts"], num_experts_per_tok=c["top_k"], decoder_sparse_step=1,
                    mlp_only_layers=[], norm_topk_prob=True, tie_word_embeddings=False, attention_bias=False,
                    use_sliding_window=False, sliding_window=None, output_router_logits=False)
    raise ValueError(c["kind"])


def layout(name: str, c: dict) -> dict:
    """What decides the checkpoint's bytes' shape: files, tensors, config."""
    ts = tensors(c)
    files = shards(ts, c.get("max_shard", MAX_SHARD)) if ts else []
    n = len(files)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)] if n > 1 else ["model.safetensors"] * n
    if c["kind"] == "raw":
        names, files = [f"{name}.bin"], [[]]
    return {"name": name, "spec": c, "files": list(zip(names, files)), "tensors": len(ts),
            "bytes": sum(nbytes(t) for t in ts) if ts else c["bytes"],
            "config": config_json(c) if ts else None}


def key(lay: dict) -> str:
    blob = json.dumps({"v": VERSION, "spec": lay["spec"], "files": lay["files"], "config": lay["config"]},
                      sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def path_of(root: str, lay: dict) -> str:
    return os.path.join(root, f"{lay['name']}-{key(lay)}")


def specs(quick: bool) -> dict:
    return QUICK if quick else FULL


# --- the bytes --------------------------------------------------------------------------

class CpuFill:
    """Random bytes from os.urandom, the high byte of each 16-bit word
    masked (the data section starts at an even offset)."""
    TABLE = bytes(b & (MASK16 >> 8) for b in range(256))

    def __init__(self, seed: int):
        pass

    def chunk(self, n: int) -> memoryview:
        b = bytearray(os.urandom(n))
        b[1::2] = b[1::2].translate(self.TABLE)
        return memoryview(b)

    def close(self):
        pass


class GpuFill:
    """Random bytes drawn on the GPU, masked there, copied into pinned
    memory: about as fast as the page cache takes them."""

    def __init__(self, seed: int):
        import torch
        self.torch = torch
        self.gen = torch.Generator(device="cuda:0")
        self.gen.manual_seed(seed)
        self.dev = torch.empty(CHUNK // 4, dtype=torch.int32, device="cuda:0")
        self.host = torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True)
        self.mask = torch.tensor(MASK16 - (1 << 16), dtype=torch.int16, device="cuda:0")
        self.stream = torch.cuda.Stream("cuda:0")

    def chunk(self, n: int) -> memoryview:
        import ctypes
        torch = self.torch
        with torch.cuda.stream(self.stream):
            self.dev.random_(generator=self.gen)
            w = self.dev.view(torch.int16)
            w.bitwise_and_(self.mask)
            self.host.copy_(self.dev.view(torch.uint8), non_blocking=True)
        self.stream.synchronize()
        return memoryview((ctypes.c_ubyte * n).from_address(self.host.data_ptr())).cast("B")

    def close(self):
        del self.dev, self.host


def gpu_fill_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def write_file(path: str, ts: list, fill, raw_bytes: int = 0) -> int:
    """One safetensors file of ts (or raw_bytes of random bytes), its bytes
    from fill; returns the bytes written."""
    head = b""
    if ts:
        head, _ = encode_header([(n, d, s, nbytes((n, d, s))) for n, d, s in ts], {"format": "pt"})
    data = sum(nbytes(t) for t in ts) if ts else raw_bytes
    with open(path, "wb", buffering=0) as f:
        f.write(head)
        done = 0
        while done < data:
            n = min(CHUNK, data - done)
            mv = fill.chunk(n)
            w = 0
            while w < n:
                w += f.write(mv[w:n])
            done += n
    return len(head) + data


def generate(root: str, name: str, spec: dict, cpu: bool = False, threads: int = 4) -> str:
    """The checkpoint name of that spec (FULL[name], QUICK[name]) under
    root: made unless a complete one of the same key is there. Returns its
    directory."""
    lay = layout(name, spec)
    d = path_of(root, lay)
    if os.path.exists(os.path.join(d, DONE)):
        say(f"{name}: there ({d})")
        return d
    if os.path.exists(d):
        shutil.rmtree(d)  # a generation cut short
    os.makedirs(d)
    use_gpu = not cpu and gpu_fill_available()
    t0 = time.perf_counter()
    jobs = list(enumerate(lay["files"]))
    errors, lock = [], threading.Lock()
    written = [0]

    def worker(k):
        fill = None
        try:
            fill = (GpuFill if use_gpu else CpuFill)(seed=1000 * VERSION + k)
            while True:
                with lock:
                    if not jobs or errors:
                        return
                    i, (fname, ts) = jobs.pop(0)
                n = write_file(os.path.join(d, fname), ts, fill, lay["bytes"] if not ts else 0)
                with lock:
                    written[0] += n
        except BaseException as e:  # noqa: BLE001: reported below, the checkpoint not marked done
            with lock:
                errors.append(e)
        finally:
            if fill is not None:
                fill.close()

    ts_ = [threading.Thread(target=worker, args=(k,)) for k in range(min(threads, len(jobs)))]
    for t in ts_:
        t.start()
    for t in ts_:
        t.join()
    if errors:
        raise errors[0]
    if lay["spec"]["kind"] == "raw":  # gpu_kv.py's write file: every block allocated (zeros), the read file's size
        zero = bytes(CHUNK)
        with open(os.path.join(d, KV_WRITE_FILE), "wb", buffering=0) as f:
            done = 0
            while done < lay["bytes"]:
                done += f.write(zero[:min(CHUNK, lay["bytes"] - done)])
        written[0] += lay["bytes"]
    if lay["config"]:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(lay["config"], f, indent=1)
        if len(lay["files"]) > 1:
            wm = {t[0]: fname for fname, ts in lay["files"] for t in ts}
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": lay["bytes"]}, "weight_map": wm}, f, indent=1)
    secs = time.perf_counter() - t0
    with open(os.path.join(d, DONE), "w") as f:
        json.dump({"layout": {k: lay[k] for k in ("name", "spec", "tensors", "bytes")}, "seconds": secs,
                   "fill": "gpu" if use_gpu else "cpu"}, f)
    say(f"{name}: {lay['tensors']} tensors, {written[0] / 1e9:.2f} GB in {len(lay['files'])} file(s) in {secs:.1f} s "
        f"({written[0] / secs / 1e9:.2f} GB/s, {'GPU' if use_gpu else 'CPU'} random bytes) -> {d}")
    return d


def need(root: str, spec_set: dict, names=NAMES) -> int:
    """Bytes the checkpoints of spec_set still have to write under root."""
    total = 0
    for n in names:
        lay = layout(n, spec_set[n])
        d = path_of(root, lay)
        if not os.path.exists(os.path.join(d, DONE)):
            total += lay["bytes"]
        if lay["spec"]["kind"] == "raw" and not os.path.exists(os.path.join(d, KV_WRITE_FILE)):
            total += lay["bytes"]
    return total


def prune(root: str) -> list:
    """Removes NAME-KEY directories under root whose KEY is neither the
    full nor the quick layout's of NAME now; returns them."""
    keep = {os.path.basename(path_of(root, layout(n, s[n]))) for s in (FULL, QUICK) for n in NAMES}
    gone = []
    for e in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if e.split("-")[0] in NAMES and e not in keep and os.path.isdir(os.path.join(root, e)):
            shutil.rmtree(os.path.join(root, e))
            gone.append(e)
    return gone


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for c in ("gen", "plan", "need", "prune"):
        p = sub.add_parser(c)
        p.add_argument("--quick", action="store_true")
        p.add_argument("--only", default=",".join(NAMES))
        if c != "plan":
            p.add_argument("--root", required=True)
        if c == "gen":
            p.add_argument("--cpu", action="store_true", help="os.urandom even where there is a GPU")
            p.add_argument("--sync", action="store_true", help="sync once written (dirty pages would be written "
                                                               "back while the rows run)")
    a = ap.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    if a.cmd == "need":
        print(need(a.root, specs(a.quick), names))
        return 0
    if a.cmd == "prune":
        for e in prune(a.root):
            say(f"removed {os.path.join(a.root, e)}")
        return 0
    if a.cmd == "plan":
        total = 0
        for n in names:
            lay = layout(n, specs(a.quick)[n])
            total += lay["bytes"]
            print(f"{n}: {lay['tensors']} tensors, {lay['bytes'] / 1e9:.2f} GB, {len(lay['files'])} file(s), key {key(lay)}")
        print(f"together: {total / 1e9:.2f} GB")
        return 0
    os.makedirs(a.root, exist_ok=True)
    for n in names:
        generate(a.root, n, specs(a.quick)[n], a.cpu)
    if a.sync:
        t0 = time.perf_counter()
        os.sync()
        say(f"sync: {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
