"""The GPU benchmark's tools, on the CPU (no torch, no GPU: stand-ins and
the emulated device): tools/gpu_report.py and gpu_rows.py print and record
only what the raw results hold (the rows of docs/bench/gpu-latest.json come
from the run's files, the reference programs' stdout parsed in their printf
formats, a row whose inputs are absent is "not run", met is computed, and
a worse value is never met whichever way its row is better); cold runs are
checked cold (mincore)."""

import json
import mmap
import os
import random
import re
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

import benchlib  # noqa: E402
import gpu_hf  # noqa: E402
import gpu_report  # noqa: E402
import gpu_rows  # noqa: E402

ROWS = ["hot_registered", "hot_registered_vs_pinned", "hot_end_to_end", "hot_vs_safetensors", "cold", "kv_16k",
        "kv_64k", "kv_256k", "kv_1m", "kv_write_16k", "kv_write_64k", "kv_write_256k", "kv_write_1m", "save_nofsync",
        "save_fsync", "save_fsync_vs_disk", "shard_row_vs_full", "shard_col_vs_full", "shard_row_vs_safetensors",
        "shard_col_vs_safetensors"]


def result(name, gbps, **extra):
    return dict(name=name, bytes=1 << 30, seconds=1 / gbps, gbps=gbps, **extra)


def timed(name, seconds):
    return dict(name=name, seconds=seconds)


# The reference programs' output, in their printf formats.
STAGED = ("C ceiling pinned H2D 1 GiB             %6.2f GB/s\n" % 55.0 +
          "A bounce  threads=%2d chunk=%2zu MiB       %6.2f GB/s\n".replace("%2zu", "%2d") % (8, 2, 40.0) +
          "A bounce  threads=%2d chunk=%2zu MiB       %6.2f GB/s\n".replace("%2zu", "%2d") % (32, 2, 50.0) +
          "B pagecache-DMA win=%4zu MiB streams=%d  %6.2f GB/s (register time %.2f s summed)\n".replace("%4zu", "%4d")
          % (256, 4, 22.0, 0.4) + "verify sample: ok\n")
KV = "C ceiling pinned H2D 1 GiB                        %7.2f GB/s\n" % 54.0
for kib, p, a, b, d in ((16, 5.7, 5.7, 18.0, 13.0), (64, 17, 17, 47, 49), (256, 34, 34, 47.5, 48.8), (1024, 44, 44, 47.7, 48.5)):
    KV += "P %4d KiB blocks: pread into pinned host only     %7.2f GB/s  %8.0f blocks/s\n" % (kib, p, 1000)
    KV += "A %4d KiB blocks: pread + one copy per block      %7.2f GB/s  %8.0f blocks/s\n" % (kib, a, 1000)
    KV += "B %4d KiB blocks: gather + 1 copy + scatter kernel %7.2f GB/s  %8.0f blocks/s\n" % (kib, b, 1000)
    KV += "D %4d KiB blocks: gather + cudaMemcpyBatchAsync    %7.2f GB/s  %8.0f blocks/s\n" % (kib, d, 1000)


def full_inputs():
    go = {"results": [result("ceiling pinned H2D 4MiB copies", 53.0), result("ceiling cold O_DIRECT read 16x4MiB", 1.8),
                      result("ceiling cold buffered read 16x4MiB", 1.5)]}
    py = {"results": [result("phxmount load_into registered hot", 49.0), result("a phxmount ioctl (python client) hot", 45.0),
                      result("c safetensors load_file cuda hot", 5.0), result("a phxmount ioctl (python client) cold", 1.75)]}
    kv = {"results": [result(f"kv {k}KiB {t} thread", g, block=k << 10, threads=t, mismatches=0)
                      for k, g1, g4 in ((16, 17.0, 16.0), (64, 45.0, 46.0), (256, 47.0, 48.0), (1024, 48.0, 48.0))
                      for t, g in ((1, g1), (4, g4))]}
    # gpu_kv.py's write runs: ours (row runs and a comparison run) and the
    # reverse reference, per block size and client threads.
    for k, mine, ref in ((16, (2.0, 2.5), (2.4, 2.2)), (64, (3.0, 3.5), (3.2, 3.6)), (256, (4.0, 4.0), (4.0, 3.0)),
                         (1024, (4.5, 5.0), (4.0, 4.2))):
        for t, g, gr in zip((1, 4), mine, ref):
            kv["results"].append(result(f"kv write {k}KiB {t} thread, 4 in flight each", g, direction="write",
                                        side="phxmount", block=k << 10, threads=t, inflight=4, row=True, mismatches=0))
            kv["results"].append(result(f"kv write reference {k}KiB {t} thread", gr, direction="write", side="reference",
                                        block=k << 10, threads=t, row=True, mismatches=0))
        kv["results"].append(result(f"kv write {k}KiB 1 thread, 1 in flight each", 0.1, direction="write",
                                    side="phxmount", block=k << 10, threads=1, inflight=1, row=False, mismatches=0))
    save = {"results": [result("phxmount save_safetensors", 9.0), result("safetensors save_file", 2.0),
                        result("phxmount save_safetensors fsync", 1.5), result("safetensors save_file fsync", 0.4),
                        result("disk write ceiling fsync buffered", 1.6), result("disk write ceiling fsync O_DIRECT", 1.4)]}
    shard = {"results": [timed("phxmount full load_safetensors", 0.2), timed("phxmount shard rows", 0.03),
                         timed("phxmount shard cols", 0.15), timed("safetensors get_slice rows", 0.5),
                         timed("safetensors get_slice cols", 0.6)]}
    return dict(go=go, py=py, kv=kv, save=save, shard=shard, ref_staged=STAGED, ref_kv=KV)


class RowsTest(unittest.TestCase):
    def test_references_parsed(self):
        s = gpu_rows.parse_staged(STAGED)
        self.assertEqual((s["pinned"], s["best"], s["verify"]), (55.0, 50.0, "ok"))
        self.assertIn("32 threads x 2 MiB", s["best_name"])
        k = gpu_rows.parse_kv(KV)
        self.assertEqual(k["pinned"], 54.0)
        self.assertEqual(k["sizes"][16 << 10], {"P": 5.7, "A": 5.7, "B": 18.0, "D": 13.0})
        self.assertEqual(gpu_rows.parse_kv(KV + "B MISMATCH\n")["mismatch"], ["B"])

    def test_every_row_from_the_inputs(self):
        rows = {r["name"]: r for r in gpu_rows.build(full_inputs())}
        self.assertEqual(list(rows)[:len(ROWS)], ROWS)
        self.assertEqual(list(rows), list(gpu_rows.SPECS), "every row of SPECS, in its order")
        self.assertTrue(all(rows[n]["status"] == "not run" for n in list(rows)[len(ROWS):]))
        self.assertEqual((rows["hot_registered"]["baseline"], rows["hot_registered"]["met"]), (50.0, True))
        self.assertAlmostEqual(rows["hot_registered_vs_pinned"]["ratio"], 49 / 55)
        self.assertFalse(rows["hot_registered_vs_pinned"]["met"])
        self.assertEqual(rows["hot_vs_safetensors"]["ratio"], 9.0)
        self.assertEqual(rows["cold"]["baseline"], 1.8)
        self.assertEqual((rows["kv_16k"]["value"], rows["kv_16k"]["baseline"]), (16.0, 18.0), "worse of the threads")
        inp = full_inputs()
        inp["kv"]["results"].append(result("kv 16KiB 1 thread, 1 in flight each", 1.0, block=16 << 10, threads=1,
                                           mismatches=0, row=False))
        self.assertEqual(gpu_rows.build(inp)[5]["value"], 16.0, "a comparison run (row=False) is no row's input")
        self.assertEqual(rows["kv_64k"]["baseline"], 49.0)
        # Writes: the worse of our thread counts against the best of the
        # reference's; comparison runs (row False) count in neither.
        w = rows["kv_write_16k"]
        self.assertEqual((w["value"], w["baseline"], w["target"]), (2.0, 2.4, 0.85))
        self.assertIn("kv write reference 16KiB 1 thread", w["baseline_name"])
        self.assertAlmostEqual(w["ratio"], 2.0 / 2.4)
        self.assertFalse(w["met"])
        self.assertEqual((rows["kv_write_64k"]["value"], rows["kv_write_64k"]["baseline"]), (3.0, 3.6))
        self.assertTrue(rows["kv_write_256k"]["met"])
        self.assertEqual((rows["kv_write_1m"]["ratio"], rows["kv_write_1m"]["met"]), (4.5 / 4.2, True))
        self.assertEqual((rows["kv_16k"]["value"], rows["kv_1m"]["value"]), (16.0, 48.0), "reads see no write run")
        self.assertAlmostEqual(rows["save_nofsync"]["ratio"], 4.5)
        fs = rows["save_fsync"]
        self.assertEqual((fs["baseline"], fs["ratio"], fs["met"]), (0.4, 3.75, True))
        self.assertNotIn("ceiling", fs)
        disk = rows["save_fsync_vs_disk"]
        self.assertEqual((disk["value"], disk["baseline"], disk["target"]), (1.5, 1.6, 0.9), "best of the two ceilings")
        self.assertAlmostEqual(disk["ratio"], 1.5 / 1.6)
        self.assertTrue(disk["met"])
        self.assertEqual((rows["shard_row_vs_full"]["unit"], rows["shard_row_vs_full"]["met"]), ("s", True))
        self.assertAlmostEqual(rows["shard_row_vs_full"]["ratio"], 0.2 / 0.03)
        self.assertAlmostEqual(rows["shard_col_vs_safetensors"]["ratio"], 4.0)
        self.assertFalse(rows["shard_col_vs_safetensors"]["met"])

    def test_nothing_measured_every_row_not_run(self):
        rows = gpu_rows.build({})
        self.assertEqual([r["name"] for r in rows], list(gpu_rows.SPECS))
        for r in rows:
            met = None if gpu_rows.SPECS[r["name"]].target is None else False
            self.assertEqual((r["status"], r["value"], r["ratio"], r["met"]), ("not run", None, None, met), r["name"])
            self.assertTrue(r["missing"], r["name"])
            self.assertTrue(set(gpu_rows.FIELDS) <= set(r), r["name"])

    def test_a_failed_check_is_not_a_figure(self):
        inp = full_inputs()
        inp["kv"]["results"][0]["mismatches"] = 3
        inp["kv"]["results"][3] = {"name": "kv 64KiB 4 thread", "error": "TimeoutError: ..."}
        rows = {r["name"]: r for r in gpu_rows.build(inp)}
        for name in ("kv_16k", "kv_64k"):
            self.assertEqual((rows[name]["status"], rows[name]["value"], rows[name]["met"]), ("failed", None, False))
        self.assertEqual(rows["kv_write_16k"]["status"], "measured", "read failures are no write row's")

    def test_a_failed_write_check_is_not_a_figure(self):
        inp = full_inputs()
        w = [r for r in inp["kv"]["results"] if r.get("direction") == "write" and r["row"]]
        w[0]["mismatches"] = 1  # ours, 16 KiB, 1 thread
        ref64 = {"name": w[7]["name"], "error": "TimeoutError: ...", "direction": "write", "side": "reference",
                 "block": 64 << 10, "threads": 4, "row": True}  # the reference, 64 KiB, 4 threads: failed
        w[7].clear()
        w[7].update(ref64)
        rows = {r["name"]: r for r in gpu_rows.build(inp)}
        for name in ("kv_write_16k", "kv_write_64k"):
            self.assertEqual((rows[name]["status"], rows[name]["value"], rows[name]["met"]), ("failed", None, False))
            self.assertTrue(rows[name]["missing"])
        self.assertEqual(rows["kv_write_256k"]["status"], "measured")
        self.assertEqual(rows["kv_16k"]["status"], "measured")

    def test_extra_rows(self):
        inp = {"extra": [{"rows": [{"name": "two_gpu_shards", "value": 100.0, "baseline": 107.6, "target": 0.5}]}]}
        r = {x["name"]: x for x in gpu_rows.build(inp)}["two_gpu_shards"]
        self.assertAlmostEqual(r["ratio"], 100 / 107.6)
        self.assertEqual((r["target"], r["met"], r["direction"]), (0.95, False, "higher"), "SPECS' target, not the file's")


class ReportTest(unittest.TestCase):
    def test_main_writes_json_and_markdown(self):
        with tempfile.TemporaryDirectory() as d:
            paths = {}
            for k, v in full_inputs().items():
                paths[k] = os.path.join(d, k)
                with open(paths[k], "w") as f:
                    f.write(v if isinstance(v, str) else json.dumps(v))
            outs = [os.path.join(d, "a", "gpu-latest.json"), os.path.join(d, "b.json")]
            md = os.path.join(d, "bench.md")
            args = [f"--{k.replace('_', '-')}={p}" for k, p in paths.items()] + [
                "--commit", "abc123", "--machine", "1x H200", "--md-out", md, "--json-out"] + outs
            with open(os.devnull, "w") as null:
                old, sys.stdout = sys.stdout, null
                try:
                    gpu_report.main(args)
                finally:
                    sys.stdout = old
            for p in outs:
                with open(p) as f:
                    doc = json.load(f)
                self.assertEqual(set(doc) >= {"date", "commit", "machine", "rows"}, True)
                self.assertEqual((doc["commit"], doc["machine"]), ("abc123", "1x H200"))
                self.assertEqual([r["name"] for r in doc["rows"]], list(gpu_rows.SPECS))
                for r in doc["rows"]:
                    self.assertTrue(set(gpu_rows.FIELDS) <= set(r), r["name"])
                    self.assertEqual(r["run"], {"date": doc["date"], "commit": "abc123", "machine": "1x H200"})
            with open(md) as f:
                text = f.read()
            self.assertIn("| kv_16k | 16.00 GB/s | 18.00 GB/s kv_blocks.cu best of A/B/D (B) | 0.89 | 0.85 | yes |", text)
            self.assertIn("| kv_64k | 45.00 GB/s | 49.00 GB/s kv_blocks.cu best of A/B/D (D) | 0.92 | 0.85 | yes |", text)
            self.assertIn("## File loads in detail", text)

    def test_absent_inputs_are_not_run(self):
        doc, _ = gpu_report.build_doc(gpu_report.argparse.Namespace(
            go="/nonexistent", py="", kv="", shard="", save="", ref_staged="", ref_kv="", rows=[], commit="c",
            machine="m", date="d"))
        self.assertTrue(all(r["status"] == "not run" for r in doc["rows"]))
        self.assertEqual(doc["inputs"]["go"], "absent: /nonexistent")
        text = gpu_report.markdown(doc, gpu_report.render({}, {}), ["issue27"])
        self.assertIn("- hot_registered: value; baseline", text)
        self.assertIn("## The rows of issue27", text)
        table = text.split("## The rows of issue27")[1]
        self.assertEqual(re.findall(r"^\| (\w+) \| not run", table, re.M), list(gpu_rows.ISSUE27_ROWS))


class ToolHelpersTest(unittest.TestCase):
    def test_helpers(self):
        import benchlib
        import gpu_bench
        self.assertEqual(gpu_bench.sweep("1x0,4x512"), [(1, 0), (4, 512)])
        self.assertEqual([benchlib.parse_size(s) for s in ("2GiB", "16KiB", "1000")], [2 << 30, 16 << 10, 1000])
        calls = []
        best, note = benchlib.best_of(3, lambda: len(calls), before=lambda: calls.append(1))
        self.assertEqual((len(calls), note >= 1), (3, True))
        ap = benchlib.tool_args(gpu_bench.__doc__)
        a = ap.parse_args(["--mount-file", "m", "--backing-file", "b", "--out", "o"])
        self.assertEqual((a.mount_file, a.backing_file, a.out), ("m", "b", "o"))


def table_rows(text):
    """The detail table's rows by path label."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| path") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells
    return rows


class DetailTableTest(unittest.TestCase):
    def test_cufile_not_run_without_measurement(self):
        g = {"results": [result("phxfs in-process library (Go) hot", 10.0), result("ceiling pinned H2D 4MiB copies", 20.0)]}
        rows = table_rows(gpu_report.render(g, {"results": []}))
        self.assertEqual(rows[gpu_report.CUFILE_LABEL][1], "not run")

    def test_nothing_measured_every_row_not_run(self):
        text = gpu_report.render({}, {})
        rows = table_rows(text)
        for label, _, _ in gpu_report.PATHS:
            self.assertEqual(rows[label][1:], ["not run", "", "", ""], label)
        for prefix in gpu_report.CEILINGS:
            self.assertEqual(rows[prefix][1], "not run", prefix)
        targets = [line for line in text.splitlines() if line.startswith("- ")]
        self.assertEqual(len(targets), 5)
        for line in targets:
            self.assertTrue(line.endswith(": not run"), line)
        self.assertIn("chosen: not run", text)

    def test_measured_rows_come_from_results(self):
        g = {"results": [result("phxfs in-process library (Go) hot", 9.0), result("ceiling pinned H2D 4MiB copies", 10.0),
                         result("e cuFile read", 3.0, note="compat mode")], "chosen": {"workers": 16}}
        p = {"results": [result("c safetensors load_file cuda hot", 1.5)]}
        text = gpu_report.render(g, p)
        rows = table_rows(text)
        self.assertEqual(rows["(b) phxfs from Go, hot"][1:4], ["9.00", "0.90 of pinned H2D", "6.0x"])
        self.assertEqual(rows[gpu_report.CUFILE_LABEL + ": e cuFile read"][1], "3.00")
        self.assertIn("- hot >= 0.9x pinned-copy ceiling (phxfs, Go): MET (0.90)", text)

    def test_one_target_per_measure(self):
        """The detail's target lines and the rows read one table: 6x safetensors
        misses the 9x target in both (issue 18, item 10)."""
        g = {"results": [result("ceiling pinned H2D 4MiB copies", 50.0)]}
        p = {"results": [result("a phxmount ioctl (python client) hot", 30.0), result("c safetensors load_file cuda hot", 5.0)]}
        text = gpu_report.render(g, p)
        rows = {r["name"]: r for r in gpu_rows.build({"go": g, "py": p})}
        want = gpu_rows.TARGETS["hot_vs_safetensors"]
        self.assertEqual((rows["hot_vs_safetensors"]["target"], rows["hot_vs_safetensors"]["met"]), (want, False))
        self.assertIn(f"- >= {want:g}x safetensors when hot (phxmount, Python): NOT MET (6.0x)", text)
        self.assertEqual(rows["hot_end_to_end"]["target"], gpu_rows.TARGETS["hot_end_to_end"])
        self.assertIn(f"- hot >= {gpu_rows.TARGETS['hot_end_to_end']:g}x pinned-copy ceiling (phxmount, Python): NOT MET (0.60)",
                      text)

    def test_a_row_not_run_has_no_figure(self):
        """A Go row that could not be measured honestly (caches not dropped)
        shows "not run" and counts in no ceiling."""
        why = "caches not dropped: permission denied"
        g = {"results": [{"name": "ceiling cold O_DIRECT read 16x4MiB", "bytes": 1 << 30, "note": "not run: " + why,
                          "error": why}, result("ceiling cold buffered read 16x4MiB", 1.5)]}
        rows = table_rows(gpu_report.render(g, {}))
        self.assertEqual(rows["ceiling cold O_DIRECT read 16x4MiB"][1], "not run")
        self.assertEqual(gpu_report.ceilings(gpu_report.index(g, {}))[1], 1.5)
        self.assertEqual(gpu_rows.baselines({"go": g})["cold"], 1.5)

    def test_cufile_failure_reported_from_results(self):
        g = {"results": [{"name": "e cuFile read", "error": "cuFileHandleRegister 5027"}]}
        row = table_rows(gpu_report.render(g, {}))[gpu_report.CUFILE_LABEL + ": e cuFile read"]
        self.assertEqual((row[1], row[4]), ("fails", "cuFileHandleRegister 5027"))


if __name__ == "__main__":
    unittest.main()


class DirectionTest(unittest.TestCase):
    """Issue 26 item 4: one row format, and a worse value is never met,
    whichever way the row is better, all the way to the report."""

    def test_a_worse_value_is_never_met(self):
        rnd = random.Random(5)
        for name, spec in gpu_rows.SPECS.items():
            if spec.target is None:
                continue
            for _ in range(50):
                base = rnd.uniform(0.01, 100)
                value = rnd.uniform(0.01, 100)
                worse = value * rnd.uniform(1.0001, 3) if spec.direction == gpu_rows.LOWER else value / rnd.uniform(1.0001, 3)
                r, w = (gpu_rows.row(name, v, base, "b", timed="t") for v in (value, worse))
                self.assertLess(w["ratio"], r["ratio"], name)
                if not r["met"]:
                    self.assertFalse(w["met"], f"{name}: {worse} met where {value} was not")
                self.assertEqual(r["met"], r["ratio"] >= spec.target)
            # Exactly at the target it is met; a hair worse, it is not.
            at = base * spec.target if spec.direction == gpu_rows.HIGHER else base / spec.target
            self.assertTrue(gpu_rows.row(name, at * (1 + 1e-9) if spec.direction == gpu_rows.HIGHER else at * (1 - 1e-9),
                                         base, "b", timed="t")["met"], name)
            hair = at * 0.999 if spec.direction == gpu_rows.HIGHER else at * 1.001
            self.assertFalse(gpu_rows.row(name, hair, base, "b", timed="t")["met"], name)
            # The same through a tool's file and the report.
            self.assertFalse(gpu_rows.judged_again(gpu_rows.row(name, hair, base, "b", timed="t"))["met"], name)
            self.assertFalse({x["name"]: x for x in gpu_rows.build(
                {"extra": [{"rows": [gpu_rows.row(name, hair, base, "b", timed="t")]}]})}[name]["met"], name)

    def test_both_directions_are_in_the_table(self):
        dirs = {s.direction for s in gpu_rows.SPECS.values()}
        self.assertEqual(dirs, {gpu_rows.HIGHER, gpu_rows.LOWER})
        self.assertEqual(gpu_rows.SPECS["hook_peak_memory"].direction, gpu_rows.LOWER)
        self.assertEqual({gpu_rows.SPECS[n].unit for n in gpu_rows.ISSUE27_ROWS}, {"GB/s", "s"})

    def test_a_hooked_peak_above_stocks_is_not_met(self):
        """gpu_hf's memory row, 10 % above stock's, as the report records it
        (extra_rows dropped the direction: it was met)."""
        stock = 7_000_000_000
        r = {"bytes": 1, "stock": {"seconds": 1.0, "peak_reserved": stock},
             "hooked": {"seconds": 0.5, "peak_reserved": int(stock * 1.1)}}
        rows = {x["name"]: x for x in gpu_hf.build_rows(r)}
        self.assertEqual((rows["hook_peak_memory"]["direction"], rows["hook_peak_memory"]["met"]), ("lower", False))
        doc = {x["name"]: x for x in gpu_rows.build({"extra": [{"rows": list(rows.values())}]})}
        peak = doc["hook_peak_memory"]
        self.assertAlmostEqual(peak["ratio"], 1 / 1.1)
        self.assertFalse(peak["met"])
        self.assertEqual(doc["hf_from_pretrained_hot"]["ratio"], 2.0)
        # Equal peaks are met; a smaller hooked peak is better still.
        r["hooked"]["peak_reserved"] = int(stock * 0.9)
        peak = {x["name"]: x for x in gpu_rows.build({"extra": [{"rows": gpu_hf.build_rows(r)}]})}["hook_peak_memory"]
        self.assertTrue(peak["met"])
        self.assertGreater(peak["ratio"], 1)

    def test_a_file_cannot_say_which_way_is_better(self):
        worse = {"name": "hook_peak_memory", "value": 110, "baseline": 100, "unit": "bytes", "ratio": 1.1, "met": True,
                 "target": 0.5}
        r = gpu_rows.judged_again(worse)
        self.assertEqual((r["met"], r["direction"], r["target"]), (False, "lower", 0.952), "no direction: SPECS'")
        flipped = gpu_rows.judged_again(dict(worse, direction="higher"))
        self.assertEqual((flipped["status"], flipped["met"]), ("failed", False))
        self.assertIn("direction", flipped["missing"][0])
        unknown = gpu_rows.judged_again({"name": "made_up", "value": 1, "baseline": 1, "met": True})
        self.assertEqual((unknown["status"], unknown["met"]), ("failed", False))
        bad_unit = gpu_rows.judged_again({"name": "cold", "value": 1, "baseline": 1, "unit": "s"})
        self.assertEqual(bad_unit["status"], "failed")
        # A failed or not-run row stays so, whatever figures it carries.
        f = gpu_rows.judged_again({"name": "cold", "value": 9, "baseline": 1, "status": "failed", "met": True})
        self.assertEqual((f["status"], f["met"], f["ratio"]), ("failed", False, None))

    def test_not_run_is_never_a_figure(self):
        for v, b in ((None, 1.0), (1.0, None), (0, 1.0), (1.0, 0), (-1.0, 1.0), (float("nan"), 1.0), (True, 1.0)):
            r = gpu_rows.row("cold", v, b, "b", timed="t")
            self.assertEqual((r["status"], r["value"], r["ratio"], r["met"]), ("not run", None, None, False), (v, b))
        r = gpu_rows.row("cold", None, 1.0, "b", timed="t", missing=["NotCold: x"])
        self.assertEqual(r["missing"], ["NotCold: x"])
        r = gpu_rows.row("cold", 2.0, 1.0, "b", timed="t", failed=["a tensor differs"])
        self.assertEqual((r["status"], r["value"], r["met"]), ("failed", None, False))
        r = gpu_rows.row("dense20_from_pretrained_load", 1.0, 2.0, "b", timed="t")
        self.assertEqual((r["ratio"], r["target"], r["met"]), (2.0, None, None), "no target: recorded, not met")

    def test_a_row_measured_twice_is_failed(self):
        one = gpu_rows.row("tp_8procs_vs_pinned", 40.0, 50.0, "p", timed="a")
        two = dict(gpu_rows.row("tp_8procs_vs_pinned", 45.0, 50.0, "p", timed="b"), run={"commit": "x"})
        r = {x["name"]: x for x in gpu_rows.build({"extra": [{"rows": [one]}, {"rows": [two]}]})}["tp_8procs_vs_pinned"]
        self.assertEqual((r["status"], r["met"]), ("failed", False))
        self.assertIn("measured 2 times", r["missing"][0])

    def test_each_row_says_its_run(self):
        os.environ.update(PHX_RUN_DATE="d1", PHX_RUN_COMMIT="c1", PHX_RUN_MACHINE="m1")
        try:
            with tempfile.TemporaryDirectory() as d:
                p = os.path.join(d, "rows.json")
                benchlib.write_json(p, {"rows": [gpu_rows.row("cold", 1.0, 2.0, "b", timed="t")]})
                with open(p) as f:
                    rows = json.load(f)["rows"]
        finally:
            for k in ("PHX_RUN_DATE", "PHX_RUN_COMMIT", "PHX_RUN_MACHINE"):
                del os.environ[k]
        self.assertEqual(rows[0]["run"], {"date": "d1", "commit": "c1", "machine": "m1"})
        stamped = gpu_rows.stamp(rows + [gpu_rows.row("hot_registered", 1.0, 2.0, "b", timed="t")],
                                 {"date": "d2", "commit": "c2", "machine": "m2"})
        self.assertEqual([r["run"]["commit"] for r in stamped], ["c1", "c2"])
        doc = {"date": "d2", "commit": "c2", "machine": "m2", "rows": gpu_rows.complete(stamped)}
        self.assertIn("measured in another run: {'date': 'd1', 'commit': 'c1', 'machine': 'm1'}",
                      gpu_report.markdown(doc, ""))


def evict(path):
    """The file's pages out of the page cache, as drop_caches does for an
    unmapped file (without dropping every other file's: other tests run)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class ColdTest(unittest.TestCase):
    """Issue 26 item 8: a cold row is timed only once mincore finds none of
    its files' pages resident; otherwise it is not run, and says why."""

    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="phxcold-", dir="/var/tmp")  # a real disk: tmpfs pages never leave
        self.f = os.path.join(self.d, "f.bin")
        with open(self.f, "wb") as f:
            f.write(os.urandom(4 << 20))

    def tearDown(self):
        shutil.rmtree(self.d)

    def read(self):
        with open(self.f, "rb") as f:
            f.read()

    def test_resident_pages(self):
        evict(self.f)
        pages = (4 << 20) // os.sysconf("SC_PAGE_SIZE")
        self.assertEqual(benchlib.resident_pages(self.f), (0, pages))
        with open(self.f, "rb") as f:
            f.seek(1 << 20)
            f.read(4096)
        r, n = benchlib.resident_pages(self.f)
        self.assertEqual(n, pages)
        self.assertGreaterEqual(r, 1)
        with open(self.f, "rb") as f:
            f.read()
        self.assertEqual(benchlib.resident_pages(self.f), (pages, pages))
        empty = os.path.join(self.d, "empty")
        open(empty, "w").close()
        self.assertEqual(benchlib.resident_pages(empty), (0, 0))

    def test_cold_start(self):
        with open(self.f, "rb") as f:
            f.read()
        drops = []
        note = benchlib.cold_start([self.f], drop=lambda: (drops.append(1), evict(self.f)))
        self.assertEqual((len(drops), note), (1, "1 file(s) checked cold (mincore)"))
        with self.assertRaises(benchlib.NotCold) as e:
            benchlib.cold_start([self.f], drop=lambda: drops.append(1) or self.read(), pause=0)
        self.assertIn(f"{self.f}: 1024 of 1024 pages resident", str(e.exception))
        self.assertEqual(len(drops), 4, "tried three times before refusing")
        # Pages a process maps survive a drop (the daemon keeps a file's
        # mapping a moment after a load): not cold.
        with open(self.f, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            m[:4096 * 3]
            with self.assertRaises(benchlib.NotCold):
                benchlib.cold_start([self.f], drop=lambda: evict(self.f), pause=0)
        # A name of the same bytes that cannot be mapped is said, not fatal.
        evict(self.f)
        note = benchlib.check_cold([self.f], [os.path.join(self.d, "absent")])
        self.assertIn("not checked", note)

    def test_a_cold_run_on_resident_files_is_not_a_figure(self):
        """The rows of a cold side that found its file resident: not run,
        with the reason, and counted in no ceiling."""
        import gpu_bench
        with open(self.f, "rb") as f:
            f.read()
        calls = []
        with self.assertRaises(benchlib.NotCold):
            benchlib.best_of(2, lambda: calls.append(1), gpu_bench.cold_before(self.f, drop=self.read))
        self.assertEqual(calls, [], "nothing timed")
        err = {"name": "a phxmount ioctl (python client) cold", "error": "NotCold: not cold after dropping caches: x"}
        rows = {r["name"]: r for r in gpu_rows.build({"py": {"results": [err]}, "go": {"results": [
            {"name": "ceiling cold O_DIRECT read 16x4MiB", "gbps": 1.8, "bytes": 1, "seconds": 1}]}})}
        self.assertEqual((rows["cold"]["status"], rows["cold"]["value"], rows["cold"]["met"]), ("not run", None, False))
        self.assertIn("NotCold", rows["cold"]["missing"][0])
        r = {"bytes": 10 ** 9, "stock": {"seconds": 1.0, "peak_reserved": 1}, "hooked": {"seconds": 0.5, "peak_reserved": 1},
             "cold_ceiling": {"odirect": {"gbps": 1.5}, "buffered": {"error": "NotCold: y"}},
             "hooked_cold": {"kind": "hooked", "error": "NotCold: z"}}
        cold = {x["name"]: x for x in gpu_hf.build_rows(r)}["hf_from_pretrained_cold"]
        self.assertEqual((cold["status"], cold["baseline"]), ("not run", 1.5))
        self.assertTrue(any("NotCold: z" in m for m in cold["missing"]))
        self.assertEqual([f for f in gpu_hf.checks(r) if "cold" in f], [],
                         "a run that could not be made cold is not run, not failed")
