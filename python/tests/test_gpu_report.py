"""tools/gpu_report.py prints only what the raw results hold: a row whose
measurement is absent says "not run"."""

import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

import gpu_report  # noqa: E402


def result(name, gbps, **extra):
    return dict(name=name, bytes=1 << 30, seconds=1 / gbps, gbps=gbps, **extra)


def table_rows(text):
    """The main table's rows by path label."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| path") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells
    return rows


class ReportTest(unittest.TestCase):
    def test_cufile_not_run_without_measurement(self):
        g = {"results": [result("phxfs in-process library (Go) hot", 10.0), result("ceiling pinned H2D 4MiB copies", 20.0)]}
        rows = table_rows(gpu_report.render(g, {"results": []}))
        self.assertEqual(rows[gpu_report.CUFILE_LABEL][1], "not run")
        self.assertNotIn("fails", rows[gpu_report.CUFILE_LABEL])

    def test_nothing_measured_every_row_not_run(self):
        text = gpu_report.render({}, {})
        rows = table_rows(text)
        for label, _, _ in gpu_report.PATHS:
            self.assertEqual(rows[label][1:], ["not run", "", "", ""], label)
        for prefix in gpu_report.CEILINGS:
            self.assertEqual(rows[prefix][1], "not run", prefix)
        self.assertEqual(rows[gpu_report.CUFILE_LABEL][1], "not run")
        targets = [line for line in text.splitlines() if line.startswith("- ")]
        self.assertEqual(len(targets), 5)
        for line in targets:
            self.assertTrue(line.endswith(": not run"), line)
        self.assertIn("chosen: not run", text)
        self.assertIn("| not run | |", text)

    def test_measured_rows_come_from_results(self):
        g = {"results": [result("phxfs in-process library (Go) hot", 9.0), result("ceiling pinned H2D 4MiB copies", 10.0),
                         result("e cuFile read", 3.0, note="compat mode")],
             "chosen": {"workers": 16}}
        p = {"results": [result("c safetensors load_file cuda hot", 1.5)]}
        text = gpu_report.render(g, p)
        rows = table_rows(text)
        self.assertEqual(rows["(b) phxfs from Go, hot"][1:4], ["9.00", "0.90 of pinned H2D", "6.0x"])
        self.assertEqual(rows[gpu_report.CUFILE_LABEL + ": e cuFile read"][1], "3.00")
        self.assertEqual(rows["(a) phxmount ioctl, Python client, hot"][1], "not run")
        self.assertIn("- hot >= 0.9x pinned-copy ceiling (phxfs, Go): MET (0.90)", text)
        self.assertIn("- hot >= 0.9x pinned-copy ceiling (phxmount, Python): not run", text)

    def test_cufile_failure_reported_from_results(self):
        g = {"results": [{"name": "e cuFile read", "error": "cuFileHandleRegister 5027"}]}
        rows = table_rows(gpu_report.render(g, {}))
        row = rows[gpu_report.CUFILE_LABEL + ": e cuFile read"]
        self.assertEqual((row[1], row[4]), ("fails", "cuFileHandleRegister 5027"))

    def test_main_writes_markdown_without_python_results(self):
        with tempfile.TemporaryDirectory() as d:
            go_json, md = os.path.join(d, "go.json"), os.path.join(d, "out.md")
            with open(go_json, "w") as f:
                json.dump({"results": []}, f)
            with open(os.devnull, "w") as null:
                old, sys.stdout = sys.stdout, null
                try:
                    gpu_report.main(go_json, None, md)
                finally:
                    sys.stdout = old
            with open(md) as f:
                self.assertEqual(table_rows(f.read())[gpu_report.CUFILE_LABEL][1], "not run")


if __name__ == "__main__":
    unittest.main()
