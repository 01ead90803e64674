"""Ratios from one GPU benchmark run: reads the Go and Python JSON files,
prints the table (ratios first) and writes it as Markdown.

Every figure comes from the raw results; a row whose measurement is absent
says "not run" (nothing here is typed in by hand)."""

import json
import sys

NOT_RUN = "not run"

# The ceilings the table expects; each is one or more results whose name
# starts with the prefix.
CEILINGS = ("ceiling pinned H2D", "ceiling page-cache read", "ceiling cold O_DIRECT", "ceiling cold buffered")

# (label, result name, ceiling) of the paths compared; "hot" rows are held
# against the pinned-copy ceiling, "cold" ones against the best cold read.
PATHS = (
    ("(a) phxmount ioctl, Python client, hot", "a phxmount ioctl (python client) hot", "hot"),
    ("(b) phxfs from Go, hot", "phxfs in-process library (Go) hot", "hot"),
    ("(c) safetensors load_file(cuda), hot", "c safetensors load_file cuda hot", "hot"),
    ("(d) pageable read + .cuda(), hot", "d pageable read + .cuda() hot", "hot"),
    ("(a) phxmount ioctl, Python client, cold", "a phxmount ioctl (python client) cold", "cold"),
    ("(b) phxfs from Go, cold, policy auto", "phxfs in-process library (Go) cold, policy auto", "cold"),
    ("(b) phxfs from Go, cold, policy never (buffered)", "phxfs in-process library (Go) cold, policy never", "cold"),
    ("(c) safetensors load_file(cuda), cold", "c safetensors load_file cuda cold", "cold"),
    ("(d) pageable read + .cuda(), cold", "d pageable read + .cuda() cold", "cold"),
)

CUFILE_LABEL = "(e) cuFile (GDS, compat mode)"
CUFILE_PREFIX = "e cuFile"


def index(g, p):
    """The results of both files by name."""
    return {x["name"]: x for x in g.get("results", []) + p.get("results", [])}


def gbps(x):
    """A result's rate, or None where it has none (absent or failed)."""
    return x.get("gbps") if x else None


def best(r, prefix):
    xs = [gbps(x) for n, x in r.items() if n.startswith(prefix) and gbps(x)]
    return max(xs) if xs else None


def path_row(r, label, key, ceil, ceil_name, st):
    """One path's row: its rate, the ratio to its ceiling and to safetensors."""
    v = gbps(r.get(key))
    if v is None:
        return (label, NOT_RUN, "", "", "")
    rc = f"{v / ceil:.2f} of {ceil_name}" if ceil else f"{ceil_name} {NOT_RUN}"
    rs = f"{v / st:.1f}x" if st else f"safetensors {NOT_RUN}"
    return (label, f"{v:.2f}", rc, rs, r[key].get("note", ""))


def cufile_rows(r):
    """cuFile rows come only from results that measured (or tried) it."""
    xs = [x for n, x in sorted(r.items()) if n.startswith(CUFILE_PREFIX)]
    if not xs:
        return [(CUFILE_LABEL, NOT_RUN, "", "", "")]
    out = []
    for x in xs:
        v = gbps(x)
        shown = f"{v:.2f}" if v is not None else "fails"
        out.append((f"{CUFILE_LABEL}: {x['name']}", shown, "", "", x.get("error") or x.get("note", "")))
    return out


def ceiling_rows(r):
    rows = []
    for prefix in CEILINGS:
        xs = [(n, x) for n, x in sorted(r.items()) if n.startswith(prefix)]
        if not xs:
            rows.append((prefix, NOT_RUN, "", "", ""))
        for n, x in xs:
            v = gbps(x)
            rows.append((n, f"{v:.2f}" if v is not None else NOT_RUN, "", "", x.get("note", "")))
    return rows


def ceilings(r):
    """(pinned-copy ceiling, best cold-read ceiling), each None if not run."""
    cold = [v for v in (best(r, "ceiling cold O_DIRECT"), best(r, "ceiling cold buffered")) if v]
    return best(r, "ceiling pinned H2D"), (max(cold) if cold else None)


def build_rows(r):
    """The table's rows: (path, GB/s, ratio to ceiling, vs safetensors, note)."""
    pinned, cold = ceilings(r)
    rows = []
    for label, key, kind in PATHS:
        st = gbps(r.get("c safetensors load_file cuda " + kind))
        ceil, name = (pinned, "pinned H2D") if kind == "hot" else (cold, "best cold read")
        rows.append(path_row(r, label, key, ceil, name, st))
    return rows + cufile_rows(r) + ceiling_rows(r)


def build_targets(r):
    """One line per target; "not run" where either side was not measured."""
    pinned, cold = ceilings(r)
    v = {k: gbps(r.get(k)) for _, k, _ in PATHS}
    specs = (
        ("hot >= 0.9x pinned-copy ceiling (phxmount, Python)", "a phxmount ioctl (python client) hot", pinned, 0.9, "{:.2f}"),
        ("hot >= 0.9x pinned-copy ceiling (phxfs, Go)", "phxfs in-process library (Go) hot", pinned, 0.9, "{:.2f}"),
        ("cold >= 0.9x best cold-read ceiling (phxmount, Python)", "a phxmount ioctl (python client) cold", cold, 0.9, "{:.2f}"),
        ("cold >= 0.9x best cold-read ceiling (phxfs, Go)", "phxfs in-process library (Go) cold, policy auto", cold, 0.9, "{:.2f}"),
        (">= 5x safetensors when hot (phxmount, Python)", "a phxmount ioctl (python client) hot",
         v["c safetensors load_file cuda hot"], 5, "{:.1f}x"),
    )
    out = []
    for what, key, base, need, fmt in specs:
        if not v[key] or not base:
            out.append(f"- {what}: {NOT_RUN}")
            continue
        x = v[key] / base
        out.append(f"- {what}: {'MET' if x >= need else 'NOT MET'} ({fmt.format(x)})")
    return out


def render(g, p):
    r = index(g, p)
    lines = ["| path | GB/s | ratio to ceiling | vs safetensors | note |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in build_rows(r)]
    sweep = ["| phxfs hot sweep | GB/s |", "| --- | --- |"]
    sweep += [f"| {x['name']} | {x['gbps']:.2f} |" for x in g.get("sweep") or []] or [f"| {NOT_RUN} | |"]
    chosen = g.get("chosen") or NOT_RUN
    return "\n".join(lines + ["", "Targets:"] + build_targets(r) + ["", f"chosen: {chosen}", ""] + sweep) + "\n"


def main(go_json, py_json, md_out):
    with open(go_json) as f:
        g = json.load(f)
    p = {"results": []}
    if py_json:
        with open(py_json) as f:
            p = json.load(f)
    text = render(g, p)
    with open(md_out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None, sys.argv[3])
