"""Ratios from one GPU benchmark run: reads the Go and Python JSON files,
prints the table (ratios first) and writes it as Markdown."""

import json
import sys


def main(go_json, py_json, md_out):
    g = json.load(open(go_json))
    p = json.load(open(py_json)) if py_json else {"results": []}
    r = {x["name"]: x for x in g.get("results", []) + p.get("results", [])}

    def rate(prefix):
        xs = [x["gbps"] for n, x in r.items() if n.startswith(prefix)]
        return max(xs) if xs else None

    pinned = rate("ceiling pinned H2D")
    pc = rate("ceiling page-cache read")
    cold_ceil = max([v for v in (rate("ceiling cold O_DIRECT"), rate("ceiling cold buffered")) if v] or [0]) or None
    rows = []

    def row(label, key, ceil, ceil_name, vs_st=None):
        x = r.get(key)
        if x is None:
            rows.append((label, "n/a", "", "", "not measured"))
            return None
        v = x["gbps"]
        rc = f"{v / ceil:.2f} of {ceil_name}" if ceil else ""
        rs = f"{v / vs_st:.1f}x" if vs_st else ""
        rows.append((label, f"{v:.2f}", rc, rs, x.get("note", "")))
        return v

    st_hot = r.get("c safetensors load_file cuda hot", {}).get("gbps")
    st_cold = r.get("c safetensors load_file cuda cold", {}).get("gbps")
    a_hot = row("(a) phxmount ioctl, Python client, hot", "a phxmount ioctl (python client) hot", pinned, "pinned H2D", st_hot)
    b_hot = row("(b) phxfs from Go, hot", "phxfs direct (Go) hot", pinned, "pinned H2D", st_hot)
    row("(c) safetensors load_file(cuda), hot", "c safetensors load_file cuda hot", pinned, "pinned H2D", st_hot)
    row("(d) pageable read + .cuda(), hot", "d pageable read + .cuda() hot", pinned, "pinned H2D", st_hot)
    a_cold = row("(a) phxmount ioctl, Python client, cold", "a phxmount ioctl (python client) cold", cold_ceil, "best cold read", st_cold)
    b_cold = row("(b) phxfs from Go, cold, policy auto", "phxfs direct (Go) cold, policy auto", cold_ceil, "best cold read", st_cold)
    row("(b) phxfs from Go, cold, policy never (buffered)", "phxfs direct (Go) cold, policy never", cold_ceil, "best cold read", st_cold)
    row("(c) safetensors load_file(cuda), cold", "c safetensors load_file cuda cold", cold_ceil, "best cold read", st_cold)
    row("(d) pageable read + .cuda(), cold", "d pageable read + .cuda() cold", cold_ceil, "best cold read", st_cold)
    rows.append(("(e) cuFile (GDS, compat mode)", "fails", "", "", "fails on this machine: cuFileHandleRegister 5027, no udev "
                 "attributes for the virtio disk (shared/notes/gpu-machine.md)"))
    for n, x in sorted(r.items()):
        if n.startswith("ceiling"):
            rows.append((n, f"{x['gbps']:.2f}", "", "", x.get("note", "")))
    lines = ["| path | GB/s | ratio to ceiling | vs safetensors | note |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    targets = []

    def target(what, ok, detail):
        targets.append(f"- {what}: {'MET' if ok else 'NOT MET'} ({detail})")

    if pinned and a_hot:
        target("hot >= 0.9x pinned-copy ceiling (phxmount, Python)", a_hot >= 0.9 * pinned, f"{a_hot / pinned:.2f}")
    if pinned and b_hot:
        target("hot >= 0.9x pinned-copy ceiling (phxfs, Go)", b_hot >= 0.9 * pinned, f"{b_hot / pinned:.2f}")
    if cold_ceil and a_cold:
        target("cold >= 0.9x best cold-read ceiling (phxmount, Python)", a_cold >= 0.9 * cold_ceil, f"{a_cold / cold_ceil:.2f}")
    if cold_ceil and b_cold:
        target("cold >= 0.9x best cold-read ceiling (phxfs, Go)", b_cold >= 0.9 * cold_ceil, f"{b_cold / cold_ceil:.2f}")
    if st_hot and a_hot:
        target(">= 5x safetensors when hot (phxmount, Python)", a_hot >= 5 * st_hot, f"{a_hot / st_hot:.1f}x")
    sweep = ["| phxfs hot sweep | GB/s |", "| --- | --- |"] + [f"| {x['name']} | {x['gbps']:.2f} |" for x in g.get("sweep", [])]
    text = "\n".join(lines + ["", "Targets:"] + targets + ["", f"chosen: {g.get('chosen')}", ""] + sweep) + "\n"
    with open(md_out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None, sys.argv[3])
