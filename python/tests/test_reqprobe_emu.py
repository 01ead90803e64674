"""tools/reqprobe.py on an emu mount with --metrics: the three views of
where opens and closes wait (this process, another process, the daemon)
each count what they should, and files off the mount are not counted."""

import os
import re
import shutil
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

from mountutil import Mount, why_not  # noqa: E402
import reqprobe  # noqa: E402


@unittest.skipIf(why_not(), why_not())
class RequestProbeTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="phxpy-", dir="/var/tmp")
        backing = os.path.join(self.work, "backing")
        os.mkdir(backing)
        for n in ("a", "probe"):
            with open(os.path.join(backing, n), "wb") as f:
                f.write(b"x" * 4096)
        self.m = Mount(backing, extra=("--metrics", "127.0.0.1:0"))
        self.addCleanup(shutil.rmtree, self.work)
        self.addCleanup(self.m.close)
        url = None
        for _ in range(50):
            self.m.log.seek(0)
            found = re.search(r"metrics: serving (http://127\.0\.0\.1:\d+/metrics)", self.m.log.read())
            if found:
                url = found.group(1)
                break
            time.sleep(0.1)
        self.assertIsNotNone(url, "no metrics URL in the daemon's log")
        self.url = url

    def test_three_views(self):
        off = os.path.join(self.work, "off-mount")
        open(off, "w").close()
        with reqprobe.RequestProbe(self.m.mnt, self.m.path("probe"), self.url) as p:
            for _ in range(5):
                os.close(os.open(self.m.path("a"), os.O_RDONLY))
                os.close(os.open(off, os.O_RDONLY))
                time.sleep(0.05)
            time.sleep(0.2)  # RELEASE is asynchronous
        s = p.summary()
        self.assertEqual(s["this_process"]["open"]["n"], 5, s)
        self.assertEqual(s["this_process"]["close"]["n"], 5, s)
        other = s["other_process"]["open"]["n"]
        self.assertGreaterEqual(other, 10, s)
        for r in ("open", "flush"):
            self.assertGreaterEqual(s["daemon"][r]["count"], 5 + other, (r, s))
            self.assertGreater(s["daemon"][r]["sum_ms"], 0, (r, s))
        self.assertGreaterEqual(s["daemon"]["release"]["count"], 5, s)

    def test_no_metrics(self):
        with reqprobe.RequestProbe(self.m.mnt, self.m.path("probe"), None) as p:
            os.close(os.open(self.m.path("a"), os.O_RDONLY))
        s = p.summary()
        self.assertTrue(s["daemon"].startswith("not run"), s)
        self.assertEqual(s["this_process"]["open"]["n"], 1, s)


if __name__ == "__main__":
    unittest.main()
