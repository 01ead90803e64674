"""The GPU benchmark's tools, on the CPU (no torch, no GPU: stand-ins and
the emulated device): tools/gpu_report.py and gpu_rows.py print and record
only what the raw results hold (the rows of docs/bench/gpu-latest.json come
from the run's files, the reference programs' stdout parsed in their printf
formats, a row whose inputs are absent is "not run", met is computed, and
a worse value is never met whichever way its row is better); cold runs are
checked cold (mincore); ckpt_gen.py's checkpoints have the shapes issue 27
asks for; tploops.py's plan and loops are vLLM's; gpu_shapes.py's
processes (shapes_children.py), rows and time budget; gpu-test.sh
issue27-plan."""

import json
import mmap
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
sys.path.insert(0, HERE)

import benchlib  # noqa: E402
import ckpt_gen  # noqa: E402
import gpu_hf  # noqa: E402
import gpu_report  # noqa: E402
import gpu_rows  # noqa: E402
import gpu_shapes  # noqa: E402
import shapes_rows  # noqa: E402
import mountutil  # noqa: E402
import shapes_children  # noqa: E402
import tploops  # noqa: E402

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
    kv = {"results": [result(f"kv {k}KiB {t} thread", g, block=k << 10, blocks=(2 << 30) // (k << 10), threads=t,
                             mismatches=0)
                      for k, g1, g4 in ((16, 17.0, 16.0), (64, 45.0, 46.0), (256, 47.0, 48.0), (1024, 48.0, 48.0))
                      for t, g in ((1, g1), (4, g4))]}
    # gpu_kv.py's write runs: ours (row runs and a comparison run) and the
    # reverse reference, per block size and client threads.
    for k, mine, ref in ((16, (2.0, 2.5), (2.4, 2.2)), (64, (3.0, 3.5), (3.2, 3.6)), (256, (4.0, 4.0), (4.0, 3.0)),
                         (1024, (4.5, 5.0), (4.0, 4.2))):
        for t, g, gr in zip((1, 4), mine, ref):
            kv["results"].append(result(f"kv write {k}KiB {t} thread, 4 in flight each", g, direction="write",
                                        side="phxmount", block=k << 10, blocks=(2 << 30) // (k << 10), threads=t,
                                        inflight=4, row=True, mismatches=0))
            kv["results"].append(result(f"kv write reference {k}KiB {t} thread", gr, direction="write", side="reference",
                                        block=k << 10, blocks=(2 << 30) // (k << 10), threads=t, row=True,
                                        mismatches=0))
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

    def test_a_reference_that_failed_its_check_is_no_baseline(self):
        """kv_blocks.cu prints "B MISMATCH" after the method's line when a
        block it checked differs: that block size's read row is failed, the
        others keep theirs (staged_ceiling.cu's mismatch spoils its ref too)."""
        inp = full_inputs()
        lines = KV.splitlines(keepends=True)
        at = next(i for i, x in enumerate(lines) if x.startswith("B   64 KiB")) + 1
        inp["ref_kv"] = "".join(lines[:at] + ["B MISMATCH\n"] + lines[at:])
        k = gpu_rows.parse_kv(inp["ref_kv"])
        self.assertEqual((k["mismatch"], k["bad_sizes"]), (["B"], {64 << 10: ["B"]}))
        rows = {r["name"]: r for r in gpu_rows.build(inp)}
        self.assertEqual((rows["kv_64k"]["status"], rows["kv_64k"]["value"]), ("failed", None))
        self.assertIn("kv_blocks.cu's check found blocks that differ (B MISMATCH)", rows["kv_64k"]["missing"])
        self.assertEqual([rows[n]["status"] for n in ("kv_16k", "kv_256k", "kv_1m")], ["measured"] * 3)

    def test_shard_rows_say_their_rank_and_world(self):
        inp = full_inputs()
        inp["shard"].update(rank=3, world=4, reps=5)
        r = {x["name"]: x for x in gpu_rows.build(inp)}["shard_col_vs_safetensors"]
        self.assertIn("shard=(dim, 3, 4)) of the col shards of every 2-D tensor, best of 5", r["timed"])

    def test_kv_rows_say_the_bytes_they_moved(self):
        """The KV rows' timed says the bytes gpu_kv.py moved (not a typed
        "2 GiB"); a read run of other bytes than kv_blocks.cu's 2 GiB (issue
        27's quick KV file, 256 MiB) is no figure against it."""
        inp = full_inputs()
        rows = {r["name"]: r for r in gpu_rows.build(inp)}
        self.assertIn("of 2 GiB of random blocks", rows["kv_16k"]["timed"])
        self.assertIn("(2 GiB)", rows["kv_write_16k"]["timed"])
        for r in inp["kv"]["results"]:
            if r.get("block") == 16 << 10:
                r["blocks"] = (256 << 20) // (16 << 10)
        rows = {r["name"]: r for r in gpu_rows.build(inp)}
        k = rows["kv_16k"]
        self.assertEqual((k["status"], k["value"], k["met"]), ("not run", None, False))
        self.assertIn("our runs moved 256 MiB, kv_blocks.cu 2 GiB", k["missing"][0])
        self.assertIn("of 256 MiB of random blocks", k["timed"])
        w = rows["kv_write_16k"]
        self.assertEqual(w["status"], "measured", "the write reference moved the same 256 MiB in the same run")
        self.assertIn("(256 MiB)", w["timed"])
        self.assertEqual(rows["kv_64k"]["status"], "measured")

    def test_hot_rows_say_what_carries_over(self):
        """The Python hot and cold rows are best of N in one process: they
        say N (gpu_bench.py's reps, cold_reps) and what the process
        carries from run to run."""
        inp = full_inputs()
        inp["py"].update(reps=3, cold_reps=1)
        rows = {r["name"]: r for r in gpu_rows.build(inp)}
        self.assertIn("best of 3 in one process, the registrations of its earlier loads reused",
                      rows["hot_vs_safetensors"]["timed"])
        self.assertIn("best of 3 in the same process", rows["hot_vs_safetensors"]["timed"])
        self.assertIn("best of 1, in the process of the hot runs", rows["cold"]["timed"])
        self.assertNotIn("registrations", rows["cold"]["timed"], "one cold run: nothing of it reused")
        inp["py"]["cold_reps"] = 2
        self.assertIn("registrations of the first reused", gpu_rows.build(inp)[4]["timed"])
        self.assertIn("best of 3 in one process", rows["hot_registered"]["timed"])

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


class HookStatsTest(unittest.TestCase):
    def test_only_a_loaded_hook_that_is_on(self):
        import types
        saved = sys.modules.get("phxmount.hook")
        try:
            sys.modules.pop("phxmount.hook", None)
            self.assertIsNone(benchlib.hook_stats())
            fake = types.ModuleType("phxmount.hook")
            fake.report = types.SimpleNamespace(files=2, tensors=9, bytes=10, fallbacks=0, starts=1, opened_ahead=1,
                                                first=1.0, last=2.0, summary=lambda: "2 file(s)")
            fake._mode = types.SimpleNamespace(on=False)
            sys.modules["phxmount.hook"] = fake
            self.assertIsNone(benchlib.hook_stats(), "loaded, off")
            fake._mode.on = True
            self.assertEqual(benchlib.hook_stats(), {"files": 2, "tensors": 9, "bytes": 10, "fallbacks": 0, "starts": 1,
                                                     "opened_ahead": 1, "first": 1.0, "last": 2.0, "summary": "2 file(s)"})
            self.assertEqual(benchlib.hook_fails([benchlib.hook_stats(), None, dict(benchlib.hook_stats(), files=0)], "x"),
                             ["x: no file went through phxmount (2 file(s))", "x: the hook was not on"])
        finally:
            if saved is None:
                sys.modules.pop("phxmount.hook", None)
            else:
                sys.modules["phxmount.hook"] = saved


class CommittedReportTest(unittest.TestCase):
    def test_docs_bench_gpu_latest_is_in_the_format(self):
        """docs/bench/gpu-latest.json: every row of SPECS in its order, every
        field, and the figures SPECS gives them (judged again, nothing moves)."""
        with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "bench", "gpu-latest.json")) as f:
            doc = json.load(f)
        self.assertEqual([r["name"] for r in doc["rows"]], list(gpu_rows.SPECS))
        for r in doc["rows"]:
            self.assertTrue(set(gpu_rows.FIELDS) | {"run"} <= set(r), r["name"])
            again = gpu_rows.judged_again(r)
            self.assertEqual({k: again[k] for k in gpu_rows.FIELDS}, {k: r[k] for k in gpu_rows.FIELDS}, r["name"])


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

    def test_rows_made_from_raw_results_say_their_run(self):
        """A tool's raw file says its run (write_json); the rows the report
        makes of it say that run, not the report's."""
        os.environ.update(PHX_RUN_DATE="d1", PHX_RUN_COMMIT="c1", PHX_RUN_MACHINE="m1")
        try:
            with tempfile.TemporaryDirectory() as d:
                p = os.path.join(d, "bench-py.json")
                benchlib.write_json(p, full_inputs()["py"])
                with open(p) as f:
                    py = json.load(f)
        finally:
            for k in ("PHX_RUN_DATE", "PHX_RUN_COMMIT", "PHX_RUN_MACHINE"):
                del os.environ[k]
        self.assertEqual(py["run"], {"date": "d1", "commit": "c1", "machine": "m1"})
        inp = dict(full_inputs(), py=py)
        rows = {r["name"]: r for r in gpu_rows.stamp(gpu_rows.build(inp), {"date": "d2", "commit": "c2",
                                                                             "machine": "m2"})}
        self.assertEqual(rows["hot_registered"]["run"]["commit"], "c1")
        self.assertEqual(rows["cold"]["run"]["commit"], "c1")
        self.assertEqual(rows["kv_16k"]["run"]["commit"], "c2", "a file without its run: the report's")

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


def tiny(name):
    """A small spec of each kind: the layouts' code with the sizes a unit
    test can write."""
    return {"moe": dict(ckpt_gen.QUICK["moe"], hidden=64, head_dim=16, heads=4, kv_heads=2, experts=8, moe_inter=32,
                        layers=3, vocab=256, max_shard=120_000),
            "dense20": dict(ckpt_gen.QUICK["dense20"], hidden=64, inter=128, heads=4, kv_heads=2, layers=4, vocab=256,
                            max_shard=60_000),
            "qwen2": dict(ckpt_gen.QUICK["qwen2"], hidden=64, inter=128, heads=8, kv_heads=2, layers=2, vocab=300),
            "kv": {"kind": "raw", "bytes": 1 << 20}}[name]


EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


class CheckpointShapesTest(unittest.TestCase):
    """Issue 27 item 5: what ckpt_gen.py generates."""

    def test_the_issues_sizes(self):
        for spec_set, quick in ((ckpt_gen.FULL, False), (ckpt_gen.QUICK, True)):
            moe = ckpt_gen.layout("moe", spec_set["moe"])
            self.assertGreaterEqual(moe["tensors"], 1500, "a MoE checkpoint of at least 1,500 tensors")
            names = [t[0] for _, ts in moe["files"] for t in ts]
            experts = [n for n in names if EXPERT.match(n)]
            c = spec_set["moe"]
            self.assertEqual(len(experts), 3 * c["experts"] * c["layers"], "one tensor per expert matrix")
            self.assertEqual(moe["config"]["model_type"], "qwen3_moe")
            if quick:
                continue
            dense = ckpt_gen.layout("dense20", spec_set["dense20"])
            self.assertGreaterEqual(dense["bytes"], 20e9)
            self.assertGreaterEqual(len(dense["files"]), 10)
            self.assertTrue(all(sum(ckpt_gen.nbytes(t) for t in ts) <= ckpt_gen.MAX_SHARD for _, ts in dense["files"]))
            q = ckpt_gen.layout("qwen2", spec_set["qwen2"])
            qn = {t[0]: t for _, ts in q["files"] for t in ts}
            self.assertTrue(all(f"model.layers.0.self_attn.{p}_proj.bias" in qn for p in "qkv"), "q/k/v biases")
            self.assertNotIn("lm_head.weight", qn, "tied embeddings: no lm_head in the file")
            self.assertTrue(q["config"]["tie_word_embeddings"])
            self.assertEqual(qn["model.norm.weight"][1], "F32", "an fp32 tensor in a bf16 file")
            self.assertLess(q["config"]["num_key_value_heads"], 8, "world 8 replicates KV heads")
        total = sum(ckpt_gen.layout(n, ckpt_gen.FULL[n])["bytes"] for n in ckpt_gen.NAMES)
        self.assertLess(total + ckpt_gen.FULL["kv"]["bytes"], 40e9, "fits the GPU machine's disk with room to spare")

    def test_generated_files(self):
        with tempfile.TemporaryDirectory(dir="/var/tmp") as root:
            dirs = {n: ckpt_gen.generate(root, n, tiny(n), cpu=True) for n in ckpt_gen.NAMES}
            for n in ("moe", "dense20", "qwen2"):
                d, lay = dirs[n], ckpt_gen.layout(n, tiny(n))
                files = tploops.files_of(d)
                self.assertEqual([os.path.basename(f) for f in files], [fn for fn, _ in lay["files"]])
                seen, blobs = [], set()
                for f in files:
                    h = benchlib.read_header(f)
                    self.assertEqual(h.metadata, {"format": "pt"})
                    self.assertEqual(os.path.getsize(f), h.data_start + h.data_len)
                    with open(f, "rb") as fh:
                        data = fh.read()[h.data_start:]
                    for t in h.tensors:
                        b = data[t.begin:t.end]
                        self.assertNotIn(b, blobs, f"{t.name}: the same bytes as another tensor")
                        blobs.add(b)
                        fmt = {"BF16": "H", "F32": "I"}[t.dtype]
                        for w in struct.unpack(f"<{len(b) // struct.calcsize(fmt)}{fmt}", b):
                            exp = (w >> 7) & 0xFF if t.dtype == "BF16" else (w >> 23) & 0xFF
                            self.assertNotEqual(exp, 0xFF, f"{t.name}: a NaN or infinity")
                    seen += [(t.name, t.dtype, t.shape) for t in h.tensors]
                self.assertEqual(seen, [(a, b, tuple(c)) for _, ts in lay["files"] for a, b, c in ts], "the model's order")
                with open(os.path.join(d, "config.json")) as fh:
                    self.assertEqual(json.load(fh), lay["config"])
                if len(files) > 1:
                    with open(os.path.join(d, "model.safetensors.index.json")) as fh:
                        idx = json.load(fh)
                    self.assertEqual(idx["weight_map"], {t[0]: fn for fn, ts in lay["files"] for t in ts})
                    self.assertEqual(idx["metadata"]["total_size"], lay["bytes"])
            self.assertGreater(len(tploops.files_of(dirs["moe"])), 1)
            self.assertEqual(sorted(os.listdir(dirs["kv"])), ["DONE", "kv-write.bin", "kv.bin"])
            self.assertEqual(os.path.getsize(os.path.join(dirs["kv"], "kv-write.bin")), 1 << 20)
            self.assertEqual(ckpt_gen.need(root, {n: tiny(n) for n in ckpt_gen.NAMES}), 0)

            # Kept for the session: a second call writes nothing; a shape
            # that differs is another checkpoint; one cut short is redone.
            f0 = tploops.files_of(dirs["moe"])[0]
            before = os.stat(f0).st_mtime_ns
            self.assertEqual(ckpt_gen.generate(root, "moe", tiny("moe"), cpu=True), dirs["moe"])
            self.assertEqual(os.stat(f0).st_mtime_ns, before)
            other = ckpt_gen.generate(root, "moe", dict(tiny("moe"), layers=2), cpu=True)
            self.assertNotEqual(other, dirs["moe"])
            os.unlink(os.path.join(other, ckpt_gen.DONE))
            self.assertEqual(ckpt_gen.need(root, {"moe": dict(tiny("moe"), layers=2)}, ["moe"]),
                             ckpt_gen.layout("moe", dict(tiny("moe"), layers=2))["bytes"])
            with open(os.path.join(other, "stale"), "w"):
                pass
            ckpt_gen.generate(root, "moe", dict(tiny("moe"), layers=2), cpu=True)
            self.assertNotIn("stale", os.listdir(other))
            gone = ckpt_gen.prune(root)
            self.assertEqual(sorted(gone), sorted([os.path.basename(dirs[n]) for n in ckpt_gen.NAMES] +
                                                  [os.path.basename(other)]), "tiny keys are no layout's of now")

    @unittest.skipIf(mountutil.why_not(), f"SKIP: {mountutil.why_not()}")
    def test_through_the_emulated_device(self):
        """The generated files load through a mount, every tensor's bytes the
        file's (the project's loader, the daemon, the emulated device)."""
        from mountutil import Mount
        from phxmount.loader import load_safetensors_emu
        work = tempfile.mkdtemp(prefix="phxck-", dir="/var/tmp")
        try:
            back = os.path.join(work, "backing")
            d = ckpt_gen.generate(back, "moe", tiny("moe"), cpu=True)
            m = Mount(back)
            try:
                for f in tploops.files_of(d):
                    h = benchlib.read_header(f)
                    got = load_safetensors_emu(os.path.join(m.mnt, os.path.relpath(f, back)))
                    with open(f, "rb") as fh:
                        data = fh.read()[h.data_start:]
                    self.assertEqual(got, {t.name: data[t.begin:t.end] for t in h.tensors})
            finally:
                m.close()
        finally:
            shutil.rmtree(work)


class NarrowPlanTest(unittest.TestCase):
    """tploops.narrow_plan is vLLM's: each rank's parameters, from the
    checkpoint's tensors."""

    def plan(self, world, rank, **cfg):
        c = dict(tiny("qwen2"), **cfg)
        lay = ckpt_gen.layout("qwen2", c)
        tensors = [(t[0], t[2]) for _, ts in lay["files"] for t in ts]
        return tploops.narrow_plan(lay["config"], tensors, rank, world), dict(tensors), lay["config"]

    def test_columns_rows_replicas_vocab(self):
        for world in (1, 2, 4, 8):
            hd = 64 // 8
            kv_cover = {}
            for rank in range(world):
                (plan, params), shapes, cfg = self.plan(world, rank)
                qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
                q = plan["model.layers.0.self_attn.q_proj.weight"]
                k = plan["model.layers.0.self_attn.k_proj.weight"]
                v = plan["model.layers.0.self_attn.v_proj.weight"]
                self.assertEqual((q.dim, q.start, q.size, q.dst_start), (0, rank * 64 // world, 64 // world, 0))
                kv_rows = hd * max(1, 2 // world)
                self.assertEqual(qkv, (64 // world + 2 * kv_rows, 64))
                self.assertEqual((k.size, k.dst_start, v.dst_start), (kv_rows, 64 // world, 64 // world + kv_rows))
                kv_cover.setdefault(k.start, []).append(rank)
                self.assertEqual(plan["model.layers.0.self_attn.k_proj.bias"].start, k.start)
                o = plan["model.layers.0.self_attn.o_proj.weight"]
                self.assertEqual((o.dim, o.start, o.size, params[o.param]), (1, rank * 64 // world, 64 // world,
                                                                            (64, 64 // world)))
                g, u = plan["model.layers.0.mlp.gate_proj.weight"], plan["model.layers.0.mlp.up_proj.weight"]
                self.assertEqual((g.param, u.param), ("model.layers.0.mlp.gate_up_proj.weight",) * 2)
                self.assertEqual((g.dst_start, u.dst_start, g.start), (0, 128 // world, rank * 128 // world))
                dn = plan["model.layers.0.mlp.down_proj.weight"]
                self.assertEqual((dn.dim, dn.size), (1, 128 // world))
                e = plan["model.embed_tokens.weight"]
                padded = 320  # 300 padded to a multiple of 64
                per = padded // world
                self.assertEqual(params[e.param], (per, 64))
                self.assertEqual((e.start, e.size, e.pad), (rank * per, max(0, min(per, 300 - rank * per)), True))
                self.assertIsNone(plan["model.norm.weight"].dim, "norms replicated")
                self.assertNotIn("lm_head.weight", plan, "tied: not in the file")
            if world == 8:  # 2 KV heads over 8 ranks: each head on 4 ranks
                self.assertEqual(kv_cover, {0: [0, 1, 2, 3], hd: [4, 5, 6, 7]})
            else:
                self.assertEqual(sorted(kv_cover), [r * hd * max(1, 2 // world) for r in range(min(world, 2))])

    def test_untied_head_and_bad_worlds(self):
        (plan, params), _, _ = self.plan(2, 1, kind="llama", inter=128)
        self.assertEqual(plan["lm_head.weight"].param, "lm_head.weight")
        (plan, _), _, cfg = self.plan(2, 0)
        self.assertNotIn("lm_head.weight", plan)
        cfg = dict(cfg, tie_word_embeddings=True)
        plan, _ = tploops.narrow_plan(cfg, [("lm_head.weight", (300, 64))], 0, 2)
        self.assertIsNone(plan["lm_head.weight"], "tied: skipped as vLLM skips it")
        with self.assertRaises(ValueError):
            self.plan(3, 0)


def staged_text(best_a, best_b=20.0, verify="ok"):
    """staged_ceiling.cu's stdout in its printf formats."""
    out = "C ceiling pinned H2D 1 GiB             %6.2f GB/s\n" % 55.0
    for t, c, v in ((8, 2, best_a * 0.8), (16, 4, best_a)):
        out += "A bounce  threads=%2d chunk=%2d MiB       %6.2f GB/s\n" % (t, c, v)
    out += "B pagecache-DMA win=%4d MiB streams=%d  %6.2f GB/s (register time %.2f s summed)\n" % (256, 4, best_b, 0.4)
    return out + f"verify sample: {verify}\n"


HOOK = {"files": 4, "tensors": 10, "bytes": 8e9, "fallbacks": 0, "starts": 1, "first": 10.0, "last": 10.2,
        "summary": "4 file(s) through phxmount"}


def hooked(seconds, compare=True, **kw):
    r = {"seconds": seconds, "bytes": int(8e9), "tensors": 10, "hook": dict(HOOK)}
    if compare:
        r.update(compared=10, mismatch=[])
    return dict(r, **kw)


class ShapesRowsTest(unittest.TestCase):
    """gpu_shapes.py's rows from its processes' results (stand-ins for what
    the GPU machine's children print), its reference over files and its
    time budget."""

    def run_of(self, quick=False):
        a = argparse_ns(ckpt_root="/x/backing/ckpt27", backing_dir="/x/backing", mount_dir="/m", quick=quick,
                        budget_s=100, reps=2, ref_files=4)
        return gpu_shapes.Run(a)

    def test_reference_over_files(self):
        ref = gpu_rows.staged_over_files([(2 << 30, staged_text(50.0)), (2 << 30, staged_text(40.0))])
        self.assertAlmostEqual(ref["best"], 2 / (1 / 50.0 + 1 / 40.0), places=6, msg="the same bytes, the summed time")
        self.assertEqual(ref["best_name"], "staged_ceiling.cu bounce 16 threads x 4 MiB, over 2 file(s)")
        self.assertIsNone(gpu_rows.staged_over_files([(1 << 30, staged_text(50.0, verify="MISMATCH"))])["best"])
        self.assertIsNone(gpu_rows.staged_over_files([(1 << 30, "")])["best"])
        dma = gpu_rows.staged_over_files([(1 << 30, staged_text(10.0, best_b=30.0))])
        self.assertEqual((dma["best"], dma["best_name"]), (30.0, "staged_ceiling.cu page-cache DMA, over 1 file(s)"))

    def test_rows(self):
        r = self.run_of()
        r.res["refs"] = {"moe": [{"file": "a", "bytes": 4 << 30, "stdout": staged_text(50.0)}],
                         "dense20": [{"file": "/x/big", "bytes": 2 << 30, "stdout": staged_text(45.0)},
                                     {"file": "/x/other", "bytes": 2 << 30, "stdout": staged_text(35.0)}]}
        r.res["moe_load_file"] = [hooked(0.2), hooked(0.25, compare=False)]
        r.res["moe_engine"] = [hooked(0.2, mismatch=["model.layers.0.mlp.experts.3.up_proj.weight"]), hooked(0.2, False)]
        st = [{"seconds": 3.0, "process_s": 6.0}, {"seconds": 2.5, "process_s": 5.5}]
        r.res["dense20_fp_user"] = {"stock": st, "hooked": [hooked(1.0, process_s=4.0), hooked(0.8, False, process_s=3.8)]}
        r.res["dense20_fp_load"] = {"stock": st, "hooked": [hooked(0.5), {"error": "exit 1: Traceback"}]}
        r.res["moe_fp_user"] = {"stock": st, "hooked": [hooked(1.0, hook=None), hooked(1.0, False)]}
        r.res["tp_narrow_8"] = {"stock": [{"seconds": 0.9}], "hooked": [hooked(0.3, ops_mismatch=["x: t"])]}
        r.res["tp_narrow_4"] = {"stock": [{"seconds": 0.9}], "hooked": [hooked(0.3)]}
        r.res["whole"] = {"file": "/x/big", "runs": [{"seconds": 0.05, "bytes": 2 << 30, "compared": 3, "mismatch": []}]}
        r.res["pinned"] = {"gbps": 55.0}
        ranks = [{"rank": k, "start": 100.0 + k * 1e-4, "end": 100.5, "bytes": 2.5e9, "compared": 1, "mismatch": [],
                  "hook": dict(HOOK)} for k in range(8)]
        r.res["procs8"] = {"ranks": ranks, "errors": []}
        r.budget.log.append(("8 rank processes at once (dense20)", 22, 3.0, ""))
        r.budget.log.append(("tensor parallel: vLLM's narrow loop and the get_slice loop (qwen2)", 900, None,
                             "not run: needs ~900 s, 50 s left"))
        with mock_exists("/x/big", 2 << 30):
            rows = {x["name"]: x for x in r.rows()}
        self.assertEqual(set(rows) - set(gpu_rows.SPECS), set())
        self.assertEqual(set(gpu_rows.ISSUE27_ROWS) - set(rows) - {"kv_16k", "kv_64k", "kv_write_16k", "kv_write_64k"},
                         set(), "every issue-27 row but the KV ones (gpu_rows makes those)")
        lf = rows["moe_load_file_vs_ref"]
        self.assertEqual((lf["status"], lf["value"], lf["baseline"]), ("measured", 8e9 / 0.2 / 1e9, 50.0), "best of the two")
        self.assertAlmostEqual(lf["ratio"], 0.8)
        self.assertFalse(lf["met"])
        self.assertEqual(rows["moe_engine_vs_ref"]["status"], "failed", "a tensor differs from stock's")
        hot = rows["dense20_from_pretrained_hot"]
        self.assertEqual((hot["status"], hot["ratio"], hot["met"]), ("measured", 2.5 / 0.8, True))
        self.assertIn("stock 5.50 s, hooked 3.80 s", hot["note"])
        self.assertEqual(rows["dense20_from_pretrained_load"]["status"], "failed", "a hooked process that erred")
        span = rows["dense20_from_pretrained_bytes_vs_ref"]
        self.assertEqual(span["status"], "failed")
        self.assertEqual(rows["moe_from_pretrained_hot"]["status"], "failed", "the hook was not on")
        self.assertIn("the hook was not on", rows["moe_from_pretrained_hot"]["missing"][0])
        self.assertEqual(rows["vllm_tp_world8"]["status"], "failed", "an engine's operation differs")
        self.assertEqual((rows["vllm_tp_world4"]["status"], rows["vllm_tp_world4"]["ratio"]), ("measured", 3.0))
        self.assertEqual(rows["vllm_tp_world2"]["status"], "not run")
        self.assertIn("not run: needs ~900 s", rows["slice_tp_world8"]["missing"][0], "the budget says why")
        p8 = rows["tp_8procs_vs_pinned"]
        self.assertAlmostEqual(p8["value"], 8 * 2.5 / 0.5)
        self.assertEqual((p8["baseline"], p8["status"]), (55.0, "measured"))
        n = len(r.dirs["dense20"]["layout"]["files"])
        self.assertTrue(r.ref_of("dense20")["best_name"].endswith(
            f"over 2 file(s) of the checkpoint's {n} (a sample; the row's side loads all {n})"))
        self.assertNotIn("sample", rows["whole_file_vs_ref"]["baseline_name"], "one file against that file")
        w = rows["whole_file_vs_ref"]
        self.assertEqual(w["baseline"], 45.0, "staged_ceiling.cu on the same file alone")
        self.assertAlmostEqual(w["value"], (2 << 30) / 0.05 / 1e9)
        for x in rows.values():
            self.assertTrue(x["timed"], x["name"])
            self.assertNotIn("QUICK", x["timed"])
        # Each row says how many fresh processes a side its figure is the best
        # of: --reps (2 here), from_pretrained's FP_REPS.
        self.assertEqual(gpu_shapes.FP_REPS, 1, "this check is written for one from_pretrained process a side")
        for name, x in rows.items():
            if name == "tp_8procs_vs_pinned":
                continue
            if "from_pretrained" in name:
                self.assertIn("one fresh process", x["timed"], name)
                self.assertNotIn("best of 2", x["timed"], name)
            else:
                self.assertIn("best of 2", x["timed"], name)
        # A rank that differs from stock fails the aggregate.
        ranks[3]["mismatch"] = ["model.norm.weight"]
        with mock_exists("/x/big", 2 << 30):
            self.assertEqual({x["name"]: x for x in r.rows()}["tp_8procs_vs_pinned"]["status"], "failed")
        q = self.run_of(quick=True)
        self.assertTrue(all(x["timed"].startswith("QUICK") or x["status"] == "not run" for x in q.rows()))

    def test_budget(self):
        b = gpu_shapes.Budget(30)
        calls = []
        self.assertIsNone(b.run("big", 60, lambda: calls.append("big")))
        self.assertEqual(b.run("small", 1, lambda: calls.append("small") or 7), 7)
        self.assertEqual(calls, ["small"])
        self.assertIn("not run: needs ~60 s", b.why("big"))
        self.assertEqual(b.why("small"), "")
        self.assertIn("| big | 60 |  | not run", b.table())
        self.assertIsNone(b.run("broken", 1, lambda: 1 / 0))
        self.assertIn("failed: ZeroDivisionError", b.why("broken"))
        self.assertEqual(b.failures(), ["step 'broken' failed: ZeroDivisionError: division by zero"])

    def test_plan_fits(self):
        """The rows' estimates fit what gpu-test.sh leaves them on a bare
        machine (its deadline, less the report's reserve and the setup
        issue27-plan estimates)."""
        for quick, budget in ((False, 570 - 25 - 55), (True, 240 - 25 - 50)):
            r = self.run_of(quick)
            r.a.reps = 1 if quick else 2
            total = sum(e for _, e, _ in r.plan())
            self.assertLess(total, budget, f"quick={quick}")


def argparse_ns(**kw):
    import argparse
    return argparse.Namespace(**kw)


class mock_exists:
    """os.path.getsize of one made-up path (the whole file's) while in use."""

    def __init__(self, path, size):
        self.path, self.size = path, size

    def __enter__(self):
        self.real = os.path.getsize
        os.path.getsize = lambda p: self.size if p == self.path else self.real(p)

    def __exit__(self, *exc):
        os.path.getsize = self.real


class Issue27ModeTest(unittest.TestCase):
    def test_plan_runs_without_a_gpu(self):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, OUT=os.path.join(d, "out"), PHX_GPU_WORK=os.path.join(d, "work"))
            for mode in ("issue27-plan", "issue27-quick-plan"):
                r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu-test.sh"), mode], env=env,
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("together ~", r.stdout)
                self.assertIn("8 rank processes at once", r.stdout)
                self.assertRegex(r.stdout, r"setup ~\d+ s")


# --- a stand-in of torch and safetensors (numpy underneath), for the loops --------------

class _Dt:
    def __init__(self, name, np_name, size):
        self.name, self.np_name, self.size = name, np_name, size

    def __repr__(self):
        return f"torch.{self.name}"


def fake_modules(np):
    """(torch, safetensors, safetensors.torch) stand-ins enough for the
    loops of tploops.py and gpu_shapes.py's children: tensors are numpy
    arrays, "cuda:0" a name, BF16 kept as its bits (casts round to nearest
    even, as torch does)."""
    import types
    torch = types.ModuleType("torch")
    bf16, f32, f16, u8 = _Dt("bfloat16", "uint16", 2), _Dt("float32", "float32", 4), _Dt("float16", "float16", 2), \
        _Dt("uint8", "uint8", 1)
    torch.bfloat16, torch.float32, torch.float16, torch.uint8 = bf16, f32, f16, u8
    by_st = {"BF16": bf16, "F32": f32, "F16": f16, "U8": u8}

    def cast(arr, src, dst):
        if src is dst:
            return arr
        if src is bf16:
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
            src = f32
        if dst is bf16:
            bits = arr.astype(np.float32).view(np.uint32)
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return arr.astype(dst.np_name)

    class Tensor:
        def __init__(self, arr, dtype, device="cpu"):
            self.a, self.dtype, self.device = arr, dtype, device

        @property
        def shape(self):
            return tuple(self.a.shape)

        def numel(self):
            return int(self.a.size)

        def element_size(self):
            return self.dtype.size

        def narrow(self, dim, start, length):
            idx = [slice(None)] * self.a.ndim
            idx[dim] = slice(start, start + length)
            return Tensor(self.a[tuple(idx)], self.dtype, self.device)

        def __getitem__(self, idx):
            return Tensor(self.a[idx], self.dtype, self.device)

        def copy_(self, src):
            if tuple(src.shape) != self.shape:
                raise RuntimeError(f"copy_ of {src.shape} into {self.shape}")
            self.a[...] = cast(src.a, src.dtype, self.dtype)
            return self

        def fill_(self, v):
            self.a[...] = v
            return self

        def contiguous(self):
            return Tensor(np.ascontiguousarray(self.a), self.dtype, self.device)

        def view(self, dt):
            return Tensor(np.ascontiguousarray(self.a).view(dt.np_name), dt, self.device)

        def to(self, device):
            return Tensor(self.a.copy(), self.dtype, device)

    def empty(shape, dtype=f32, device="cpu"):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return Tensor(np.zeros(shape, dtype=dtype.np_name), dtype, device)

    torch.Tensor, torch.empty = Tensor, empty
    torch.equal = lambda a, b: a.shape == b.shape and bool(np.array_equal(a.a, b.a))
    torch.cuda = types.SimpleNamespace(synchronize=lambda *a: None, is_available=lambda: False)

    st = types.ModuleType("safetensors")
    st_torch = types.ModuleType("safetensors.torch")

    class Slice:
        def __init__(self, t):
            self.t = t

        def get_shape(self):
            return list(self.t.shape)

        def __getitem__(self, idx):
            return self.t[idx]

    class SafeOpen:
        def __init__(self, path, framework, device="cpu"):
            h = benchlib.read_header(path)
            raw = np.fromfile(path, dtype=np.uint8)[h.data_start:]
            self.ts = {t.name: Tensor(raw[t.begin:t.end].view(by_st[t.dtype].np_name).reshape(t.shape).copy(),
                                      by_st[t.dtype], device) for t in h.tensors}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def keys(self):
            return list(self.ts)

        def get_tensor(self, k):
            return self.ts[k]

        def get_slice(self, k):
            return Slice(self.ts[k])

    st.safe_open = SafeOpen
    st_torch.load_file = lambda path, device="cpu": dict(SafeOpen(path, "pt", device).ts)
    st.torch = st_torch
    return torch, st, st_torch, cast


@unittest.skipIf(mountutil.np is None, f"SKIP: {mountutil.WHY_NO_NUMPY}")
class LoopsTest(unittest.TestCase):
    """tploops.py's loops and gpu_shapes.py's children on stand-ins of torch
    and safetensors: what each rank's parameters hold is the checkpoint's
    bytes as vLLM's loaders place them, and the comparisons catch a tensor
    that differs."""

    @classmethod
    def setUpClass(cls):
        np = cls.np = mountutil.np
        cls.torch, st, st_torch, cast = fake_modules(np)
        cls.cast = staticmethod(cast)
        cls.saved = {k: sys.modules.get(k) for k in ("torch", "safetensors", "safetensors.torch")}
        sys.modules.update({"torch": cls.torch, "safetensors": st, "safetensors.torch": st_torch})
        cls.root = tempfile.mkdtemp(prefix="phxloops-", dir="/var/tmp")
        cls.q = ckpt_gen.generate(os.path.join(cls.root, "a"), "qwen2", dict(tiny("qwen2"), max_shard=40_000), cpu=True)
        cls.q_copy = os.path.join(cls.root, "copy")
        shutil.copytree(cls.q, cls.q_copy)
        cls.other = ckpt_gen.generate(os.path.join(cls.root, "b"), "qwen2", dict(tiny("qwen2"), max_shard=40_000),
                                      cpu=True)  # the same shapes, other bytes
        cls.moe = ckpt_gen.generate(os.path.join(cls.root, "a"), "moe", tiny("moe"), cpu=True)

    @classmethod
    def tearDownClass(cls):
        for k, v in cls.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        shutil.rmtree(cls.root)

    def file_tensors(self, d):
        out = {}
        for f in tploops.files_of(d):
            with sys.modules["safetensors"].safe_open(f, "pt") as g:
                out.update(g.ts)
        return out

    def args(self, **kw):
        return argparse_ns(**dict(dict(device="cuda:0", start_at=0.0, ops=False, ref=""), **kw))

    def test_narrow_loop_is_vllms(self):
        np, want = self.np, self.file_tensors(self.q)
        self.assertGreater(len(tploops.files_of(self.q)), 1, "more than one file")
        for world in (1, 2, 4, 8):
            for rank in range(world):
                plan, params = tploops.narrow_params(self.q, rank, world)
                got, _ = tploops.narrow_loop(tploops.files_of(self.q), plan, params)
                qpr, hd = 64 // world, 8
                kv_rows, kv_head = (hd, rank // (world // 2)) if world >= 2 else (2 * hd, 0)
                qkv = got["model.layers.1.self_attn.qkv_proj.weight"].a
                w = {p: want[f"model.layers.1.self_attn.{p}_proj.weight"].a for p in "qkvo"}
                np.testing.assert_array_equal(qkv[:qpr], w["q"][rank * qpr:(rank + 1) * qpr])
                np.testing.assert_array_equal(qkv[qpr:qpr + kv_rows], w["k"][kv_head * kv_rows:(kv_head + 1) * kv_rows])
                np.testing.assert_array_equal(qkv[qpr + kv_rows:], w["v"][kv_head * kv_rows:(kv_head + 1) * kv_rows])
                bias = got["model.layers.1.self_attn.qkv_proj.bias"].a
                np.testing.assert_array_equal(bias[:qpr], want["model.layers.1.self_attn.q_proj.bias"].a[rank * qpr:(rank + 1) * qpr])
                np.testing.assert_array_equal(got["model.layers.1.self_attn.o_proj.weight"].a,
                                              w["o"][:, rank * qpr:(rank + 1) * qpr])
                ipr = 128 // world
                gu = got["model.layers.0.mlp.gate_up_proj.weight"].a
                np.testing.assert_array_equal(gu[ipr:], want["model.layers.0.mlp.up_proj.weight"].a[rank * ipr:(rank + 1) * ipr])
                np.testing.assert_array_equal(got["model.layers.0.mlp.down_proj.weight"].a,
                                              want["model.layers.0.mlp.down_proj.weight"].a[:, rank * ipr:(rank + 1) * ipr])
                emb, per = got["model.embed_tokens.weight"].a, 320 // world
                n = max(0, min(per, 300 - rank * per))
                np.testing.assert_array_equal(emb[:n], want["model.embed_tokens.weight"].a[rank * per:rank * per + n])
                self.assertFalse(emb[n:].any(), "the vocabulary's padding zeroed")
                norm = got["model.norm.weight"]
                self.assertEqual(norm.dtype, self.torch.bfloat16, "an F32 norm cast to the model's dtype")
                np.testing.assert_array_equal(norm.a, self.cast(want["model.norm.weight"].a, self.torch.float32,
                                                                self.torch.bfloat16))

    def test_children_compare(self):
        # Another test module imported phxmount.hook (which turns it on)
        # when the tests were collected: this process has no hook.
        with mock.patch.dict(sys.modules, {"phxmount.hook": None}):
            self.children_compare()

    def children_compare(self):
        for loop in ("narrow", "slice"):
            same = tploops.child(self.args(loop=loop, dir=self.q, ref=self.q_copy, rank=3, world=4))
            self.assertEqual(same["mismatch"], [], loop)
            self.assertGreater(same["compared"], 10)
            self.assertIsNone(same["hook"], "no hook in this process")
            other = tploops.child(self.args(loop=loop, dir=self.q, ref=self.other, rank=3, world=4))
            self.assertTrue(other["mismatch"], f"{loop}: other bytes must differ")
        with tempfile.TemporaryDirectory() as gate:  # timed together: the check waits for the others' marks
            b = tploops.child(self.args(loop="slice", dir=self.q, ref=self.q_copy, rank=0, world=2, barrier=gate,
                                        barrier_n=1, barrier_timeout=5))
            self.assertEqual((b["mismatch"], "barrier_s" in b, os.listdir(gate)), ([], True, ["rank-0.done"]))
        s = tploops.child(self.args(loop="slice", dir=self.q, rank=1, world=2))
        want = self.file_tensors(self.q)
        self.assertEqual(s["bytes"], sum(
            t.numel() * 2 // (2 if tploops.tp_dim(k, t.shape) is not None else 1) if t.dtype is self.torch.bfloat16
            else t.numel() * 4 for k, t in want.items()))
        for kind in ("load_file", "engine"):
            fn = shapes_children.CHILDREN[kind]
            r = fn(argparse_ns(dir=self.moe, ref=self.moe))
            self.assertEqual((r["mismatch"], r["tensors"]), ([], 102), kind)
            self.assertEqual(r["bytes"], ckpt_gen.layout("moe", tiny("moe"))["bytes"])
            self.assertTrue(fn(argparse_ns(dir=self.q, ref=self.other))["mismatch"], kind)


class TpWorldRowsTest(unittest.TestCase):
    """gpu_tp's tp_world rows: every repetition a fresh process (one call of
    loop_in_fresh_process each), both sides, the first hooked one comparing."""

    def test_fresh_processes(self):
        import gpu_tp
        calls = []

        def fake(mnt, back, rank, world, hooked, compare):
            calls.append((rank, world, hooked, compare))
            if not hooked:
                return {"seconds": 1.0 / world}
            r = {"seconds": 0.1 / world, "hook": dict(HOOK_TP)}
            return dict(r, compared=5, mismatch=[]) if compare else r

        real = gpu_tp.loop_in_fresh_process
        gpu_tp.loop_in_fresh_process = fake
        try:
            rows, fails = gpu_tp.engine_rows("/m", "/b", {})
            self.assertEqual(fails, [])
            self.assertEqual(len(calls), 2 * 2 * 2 * 3, "2 ranks x 2 repetitions x 2 sides x 3 worlds")
            self.assertEqual(sum(1 for c in calls if c[3]), 6, "the first hooked process of each rank compares")
            self.assertEqual([(r["name"], r["ratio"], r["status"]) for r in rows],
                             [(f"tp_world{w}", 10.0, "measured") for w in (2, 4, 8)])
            self.assertIn("the one with the lower speed-up", rows[0]["timed"], "which rank's figure it is")
            calls.clear()
            rows, _ = gpu_tp.engine_rows("/m", "/b", {}, ranks="last")
            self.assertEqual(len(calls), 12)
            self.assertIn("rank 7", rows[2]["timed"])
            HOOK_TP["fallbacks"] = 1
            rows, fails = gpu_tp.engine_rows("/m", "/b", {})
            self.assertTrue(all(r["status"] == "failed" for r in rows))
            self.assertTrue(any("fell back" in f for f in fails))
        finally:
            gpu_tp.loop_in_fresh_process = real
            HOOK_TP["fallbacks"] = 0

    def test_stock_reads_the_backing_directory(self):
        """Stock reads the files as a program without phxmount does (the
        backing directory), not through the mount's FUSE page cache; the
        hooked side reads the mount and compares against the backing files."""
        import gpu_tp

        def opt(argv, k):
            return argv[argv.index(k) + 1] if k in argv else None

        stock = gpu_tp.loop_argv("/m/ck", "/b/ck", 7, 8, False, False)
        hooked = gpu_tp.loop_argv("/m/ck", "/b/ck", 7, 8, True, True)
        self.assertEqual((opt(stock, "--dir"), opt(stock, "--ref")), ("/b/ck", None))
        self.assertEqual((opt(hooked, "--dir"), opt(hooked, "--ref")), ("/m/ck", "/b/ck"))
        self.assertIn("backing directory", self.rows_with(gpu_tp)[0]["baseline_name"])

    def rows_with(self, gpu_tp):
        real = gpu_tp.loop_in_fresh_process
        gpu_tp.loop_in_fresh_process = lambda m, b, r, w, h, c: dict(
            {"seconds": 0.1, "hook": dict(HOOK_TP)}, **({"compared": 1, "mismatch": []} if c else {}))
        try:
            return gpu_tp.engine_rows("/m", "/b", {})[0]
        finally:
            gpu_tp.loop_in_fresh_process = real


class BarrierTest(unittest.TestCase):
    """The rank processes timed together compare with stock only once all
    are past their clocks (benchlib.barrier)."""

    def test_none_passes_before_all_arrive(self):
        import threading
        with tempfile.TemporaryDirectory() as d:
            passed, late = [], threading.Event()

            def rank(k):
                if k == 2:
                    late.wait(5)
                benchlib.barrier(d, f"rank-{k}", 3, timeout=10)
                passed.append((k, late.is_set()))

            ts = [threading.Thread(target=rank, args=(k,)) for k in range(3)]
            for t in ts:
                t.start()
            time.sleep(0.2)
            self.assertEqual(passed, [], "nobody passes while rank 2 is still in its clock")
            late.set()
            for t in ts:
                t.join(10)
            self.assertEqual(sorted(k for k, _ in passed), [0, 1, 2])
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(TimeoutError):
                benchlib.barrier(d, "rank-0", 2, timeout=0.05)

    def test_rank_processes_are_given_a_barrier(self):
        r = ShapesRowsTest().run_of()
        argv = r.procs8_argv("tploops.py", 3, 100.0, "/tmp/gate")
        self.assertEqual(argv[argv.index("--barrier") + 1:argv.index("--barrier") + 4], ["/tmp/gate", "--barrier-n", "8"])
        ranks = [{"rank": k, "start": 100.0, "end": 100.5, "bytes": 1e9, "compared": 1, "mismatch": [],
                  "hook": dict(HOOK)} for k in range(8)]
        ranks[5]["barrier_error"] = "7 of 8 processes reached the barrier"
        r.res["procs8"] = {"ranks": ranks, "errors": []}
        r.res["pinned"] = {"gbps": 55.0}
        p8 = shapes_rows.procs_row(r, "")
        self.assertEqual(p8["status"], "failed")
        self.assertIn("compared beside the others' clocks", p8["missing"][0])


class RankCallRowTest(unittest.TestCase):
    """tp_rank_vs_ceiling: every repetition a fresh process (none after a
    hooked loop or an earlier load in the same process), the first one
    checked against stock, a difference failing the row."""

    def test_fresh_processes(self):
        import gpu_tp
        argvs = []

        def fake(argv, **kw):
            argvs.append(argv)
            r = {"seconds": 0.05 + 0.01 * len(argvs), "bytes": int(1e9), "rank": 7}
            return dict(r, mismatch=[]) if "--ref" in argv else r

        with mock.patch.object(gpu_tp, "fresh", fake):
            rows, fails = gpu_tp.rank_call_row("/m/ck", "/b/ck", 50.0, {})
        self.assertEqual((len(argvs), fails), (3, []))
        self.assertTrue(all("child-rank" in a for a in argvs))
        self.assertEqual(["--ref" in a for a in argvs], [True, False, False], "the first process compares")
        r = rows[0]
        self.assertEqual(r["status"], "measured")
        self.assertAlmostEqual(r["value"], 0.06, msg="the best of the three")
        self.assertAlmostEqual(r["baseline"], 1e9 / 50e9 + 0.010)
        self.assertIn("fresh process per repetition", r["timed"])

        def differs(argv, **kw):
            return {"seconds": 0.01, "bytes": int(1e9), "mismatch": ["model.norm.weight"] if "--ref" in argv else []}

        with mock.patch.object(gpu_tp, "fresh", differs):
            rows, fails = gpu_tp.rank_call_row("/m/ck", "/b/ck", 50.0, {})
        self.assertEqual((rows[0]["status"], rows[0]["value"]), ("failed", None), "a tensor that differs is no figure")
        self.assertTrue(fails)


class EngineIteratorTest(unittest.TestCase):
    def test_stock_reads_the_backing_directory(self):
        """engine_iterator_hot: stock's loop on the backing directory, the
        hooked one on the mount (compared with the backing files)."""
        calls = []
        with mock.patch.object(gpu_hf, "fresh", lambda kind, d, ref="", hook="": calls.append((kind, d, ref, hook))):
            gpu_hf.engine_sides("/m/llama", "/b/llama")
        self.assertEqual(calls, [("engine", "/b/llama", "", ""), ("engine", "/m/llama", "/b/llama", "cuda:0")])
        r = {"bytes": 1, "engine_stock": {"seconds": 2.0}, "engine_hooked": {"seconds": 1.0}}
        e = {x["name"]: x for x in gpu_hf.build_rows(r)}["engine_iterator_hot"]
        self.assertEqual(e["ratio"], 2.0)
        self.assertIn("backing directory", e["baseline_name"])


HOOK_TP = {"files": 2, "fallbacks": 0, "summary": "2 file(s) through phxmount"}
