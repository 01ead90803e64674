"""The report of one GPU benchmark run (scripts/gpu-test.sh bench, focus,
issue27): docs/bench/gpu-latest.json, {"date", "commit", "machine", "rows":
[...]} with every row of gpu_rows.SPECS in its format (gpu_rows.py computes
the rows of issues 9 and 15 from the raw outputs, ratios to the reference
programs and ceilings measured in the same run; the other tools' rows
come in by --rows and are judged again by SPECS; a row that no input
measured is "not run"; each row says which run measured it), and a
Markdown file with the measured rows first, then why the others did not
run, then the detail table of the file loads (paths against their
ceilings and safetensors).

    gpu_report.py --go bench-go.json --py bench-py.json --kv bench-kv.json \
        --shard bench-shard.json --save bench-save.json \
        --ref-staged ref-staged_ceiling.txt --ref-kv ref-kv_blocks.txt \
        [--rows more.json ...] --commit C --machine M --json-out gpu-latest.json --md-out bench.md

Every figure comes from the raw results; a row whose measurement is absent
says "not run" (nothing here is typed in by hand). An input file that is
absent is a measurement that did not run."""

import argparse
import datetime
import json
import os
import sys

import gpu_rows

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


gbps = gpu_rows.gbps  # a result's rate; None where absent, failed or not run


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
    t = gpu_rows.TARGETS
    py_hot, py_cold = "a phxmount ioctl (python client) hot", "a phxmount ioctl (python client) cold"
    specs = (
        (f"hot >= {t['hot_end_to_end']:g}x pinned-copy ceiling (phxmount, Python)", py_hot, pinned, t["hot_end_to_end"], "{:.2f}"),
        (f"hot >= {t['hot_registered_vs_pinned']:g}x pinned-copy ceiling (phxfs, Go)", "phxfs in-process library (Go) hot",
         pinned, t["hot_registered_vs_pinned"], "{:.2f}"),
        (f"cold >= {t['cold']:g}x best cold-read ceiling (phxmount, Python)", py_cold, cold, t["cold"], "{:.2f}"),
        (f"cold >= {t['cold']:g}x best cold-read ceiling (phxfs, Go)", "phxfs in-process library (Go) cold, policy auto",
         cold, t["cold"], "{:.2f}"),
        (f">= {t['hot_vs_safetensors']:g}x safetensors when hot (phxmount, Python)", py_hot,
         v["c safetensors load_file cuda hot"], t["hot_vs_safetensors"], "{:.1f}x"),
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
    """The detail table of the file loads (paths, ceilings, sweep)."""
    r = index(g, p)
    lines = ["| path | GB/s | ratio to ceiling | vs safetensors | note |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in build_rows(r)]
    sweep = ["| phxfs hot sweep | GB/s |", "| --- | --- |"]
    sweep += [f"| {x['name']} | {x['gbps']:.2f} |" for x in g.get("sweep") or []] or [f"| {NOT_RUN} | |"]
    chosen = g.get("chosen") or NOT_RUN
    return "\n".join(lines + ["", "Targets:"] + build_targets(r) + ["", f"chosen: {chosen}", ""] + sweep) + "\n"


def fmt(v, unit):
    if v is None:
        return NOT_RUN
    if unit == "s":
        return f"{v:.4f} s"
    if unit == "bytes":
        return f"{v / 1e9:.3f} GB"
    return f"{v:.2f} {unit}"


def met_cell(r) -> str:
    if r.get("target") is None:
        return "(no target)"
    return "yes" if r.get("met") else "NO" if r.get("status") == gpu_rows.MEASURED else "no"


def row_line(r) -> str:
    unit = r.get("unit", "GB/s")
    target = "" if r.get("target") is None else f"{r['target']}"
    if r.get("status", "measured") != "measured" or r.get("ratio") is None:
        why = "; ".join(r.get("missing") or [])
        return f"| {r['name']} | {r.get('status') or NOT_RUN}{f' ({why})' if why else ''} | {fmt(r.get('baseline'), unit)} " \
               f"{r.get('baseline_name', '')} | | {target} | {met_cell(r)} |"
    return (f"| {r['name']} | {fmt(r['value'], unit)} | {fmt(r['baseline'], unit)} {r.get('baseline_name', '')} "
            f"| {r['ratio']:.2f} | {target} | {met_cell(r)} |")


def run_of(doc: dict) -> dict:
    return {"date": doc["date"], "commit": doc["commit"], "machine": doc["machine"]}


def markdown(doc: dict, detail: str, tables=()) -> str:
    lines = [f"GPU benchmark {doc['date']}, commit {doc['commit']}, {doc['machine']}", "",
             "| row | value | baseline | ratio | target | met |", "| --- | --- | --- | --- | --- | --- |"]
    measured = [r for r in doc["rows"] if r.get("status") != NOT_RUN]
    lines += [row_line(r) for r in measured]
    skipped = [r for r in doc["rows"] if r.get("status") == NOT_RUN]
    lines += ["", f"Not run ({len(skipped)}):"] + [f"- {r['name']}: {'; '.join(r.get('missing') or [])}" for r in skipped]
    b = doc.get("baselines", {})
    lines += [""] + [f"- {r['name']} ({r.get('direction')} is better): {r.get('timed', '')}"
                     + (f"; {r['note']}" if r.get("note") else "")
                     + (f"; measured in another run: {r['run']}" if r.get("run") and r["run"] != run_of(doc) else "")
                     for r in measured]
    lines += ["", "Ratios are better when higher: value / baseline where a higher value is better (rates), "
                  "baseline / value where a lower one is (times, memory peaks: a speed-up). met = ratio >= target.",
              f"Reference check: staged_ceiling.cu verify sample {b.get('staged_verify') or NOT_RUN}; "
              f"kv_blocks.cu mismatches {b.get('kv_mismatch') if b.get('kv_mismatch') is not None else NOT_RUN}.",
              "", "## File loads in detail", "", detail]
    for name in tables:
        by = {r["name"]: r for r in doc["rows"]}
        lines += ["", f"## The rows of {name}", "", "| row | value | baseline | ratio | target | met |",
                  "| --- | --- | --- | --- | --- | --- |"] + [row_line(by[n]) for n in gpu_rows.TABLES[name] if n in by]
    return "\n".join(lines)


def read(path, as_json=True):
    """A file's JSON (or text); None when absent (the step did not run)."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f) if as_json else f.read()


def build_doc(a) -> dict:
    inp = {k: read(getattr(a, k)) for k in ("go", "py", "kv", "shard", "save")}
    inp.update(ref_staged=read(a.ref_staged, False), ref_kv=read(a.ref_kv, False),
               extra=[d for d in (read(x) for x in a.rows) if d])
    b = gpu_rows.baselines(inp)
    date = a.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    run = {"date": date, "commit": a.commit, "machine": a.machine}
    return {"date": date, "commit": a.commit, "machine": a.machine, "rows": gpu_rows.stamp(gpu_rows.build(inp), run),
            "baselines": {k: v for k, v in b.items() if k != "kv"}, "reference_kv": b["kv"],
            "inputs": {k: (getattr(a, k) if inp.get(k) is not None else f"absent: {getattr(a, k)}")
                       for k in ("go", "py", "kv", "shard", "save", "ref_staged", "ref_kv")}}, inp


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the GPU benchmark report")
    for k in ("go", "py", "kv", "shard", "save", "ref-staged", "ref-kv"):
        ap.add_argument(f"--{k}", default="")
    ap.add_argument("--rows", nargs="*", default=[], help="JSON files of more rows ({\"rows\": [...]})")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--machine", default="unknown")
    ap.add_argument("--date", default="")
    ap.add_argument("--table", action="append", default=[], choices=sorted(gpu_rows.TABLES),
                    help="also a table of these rows alone, in their order (issue27: its Targets table)")
    ap.add_argument("--json-out", nargs="+", required=True)
    ap.add_argument("--md-out", required=True)
    a = ap.parse_args(argv)
    doc, inp = build_doc(a)
    text = markdown(doc, render(inp.get("go") or {}, inp.get("py") or {}), a.table)
    for path in a.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    with open(a.md_out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
