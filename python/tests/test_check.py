"""python -m phxmount check (issue 26 item 11): what the hook would do here,
and why, before it serves a file. In fresh interpreters on a real emu
mount: the versions of safetensors (a stand-in package with its
dist-info, and the signature the hook binds to) and torch ("not
installed"), the mode PHXMOUNT_HOOK puts the hook in, the mount in the
mount table with its backing, and for a file on the mount, a file off it
and a directory what a load would do and why; the exit status (0, 1, 2);
that it imports neither the hook nor torch. In the process, with the
daemon's answer standing in for an NVIDIA GPU's: a load the hook serves,
exit 0. test_packaging checks what it says of the .pth hook in a venv."""

import io
import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from hookutil import PYDIR, write_tree
from mountutil import MountedCase, make_file, why_not

from phxmount import check  # noqa: E402
from phxmount.availability import Availability  # noqa: E402

WHY = why_not()

STAND_IN = {
    "safetensors/__init__.py": "class safe_open:\n"
                               "    def __init__(self, filename, framework, device='cpu', *, backend='mmap'):\n"
                               "        pass\n"
                               "    def keys(self):\n"
                               "        return []\n",
    "safetensors-0.8.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: safetensors\nVersion: 0.8.0\n",
}


def run_check(args, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("PHXMOUNT_HOOK")}
    e.update(env)
    e["PYTHONPATH"] = os.pathsep.join([p for p in (e.pop("EXTRA_PATH", None), PYDIR) if p])
    return subprocess.run([sys.executable, "-m", "phxmount", *args], env=e, capture_output=True, text=True,
                          timeout=60)


class UsageTest(unittest.TestCase):
    def test_bad_usage_is_2_with_a_message(self):
        for args, said in ((["bogus"], "invalid choice: 'bogus'"), (["check", "--device", "mps"], "--device 'mps'"),
                           (["check", "--nope"], "unrecognized arguments: --nope")):
            r = run_check(args)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            self.assertIn(said, r.stderr)
            self.assertIn("usage:", r.stderr)
        r = run_check(["check", "--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("Exit status 0", r.stdout)

    def test_no_path_no_mount_needed(self):
        r = run_check([])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for line in ("torch: not installed", "mode: PHXMOUNT_HOOK unset: off", "phxmount.hook is not imported"):
            self.assertIn(line, r.stdout)
        self.assertIn("get_tensor's deferral on (PHXMOUNT_HOOK_DEFER); whole files ahead of a loader's binds on "
                      "(PHXMOUNT_HOOK_SPECULATE); the next file of a series started before its open on "
                      "(PHXMOUNT_HOOK_NEXT)", r.stdout)
        r = run_check([], PHXMOUNT_HOOK_DEFER="0", PHXMOUNT_HOOK_SPECULATE="off", PHXMOUNT_HOOK_NEXT="0")
        self.assertIn("deferral off (PHXMOUNT_HOOK_DEFER); whole files ahead of a loader's binds off "
                      "(PHXMOUNT_HOOK_SPECULATE); the next file of a series started before its open off", r.stdout)
        r = run_check(["check"], PHXMOUNT_HOOK="gpu")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("PHXMOUNT_HOOK='gpu': want 0, 1 (auto), cuda or cuda:N: the hook is off", r.stdout)


@unittest.skipIf(WHY, f"SKIP: {WHY}")
class CheckTest(MountedCase):
    staged = True

    @classmethod
    def populate(cls, backing):
        make_file(os.path.join(backing, "m.safetensors"))
        make_file(os.path.join(backing, "n.safetensors"))
        with open(os.path.join(backing, "bad.safetensors"), "wb") as f:
            f.write(b"\xff" * 16)

    def setUp(self):
        self.pkgs = tempfile.mkdtemp(prefix="phxcheck-")
        write_tree(self.pkgs, STAND_IN)

    def tearDown(self):
        import shutil
        shutil.rmtree(self.pkgs)

    def test_what_a_load_would_do(self):
        f = self.m.path("m.safetensors")
        off = os.path.join(self.work, "off.safetensors")
        make_file(off)
        r = run_check(["check", f, off, self.m.mnt, "/nonexistent"], PHXMOUNT_HOOK="1", EXTRA_PATH=self.pkgs)
        out = r.stdout
        self.assertEqual(r.returncode, 1, out + r.stderr)
        self.assertIn(f"safetensors: 0.8.0 ({os.path.join(self.pkgs, 'safetensors')})", out)
        self.assertIn("the hook binds calls to safe_open(filename, framework, device='cpu', *, backend='mmap')", out)
        self.assertIn("torch: not installed", out)
        self.assertIn("mode: PHXMOUNT_HOOK='1': on; tensors asked for on the cpu stay host tensors", out)
        self.assertIn(f"  {self.m.mnt} (over {self.backing}): device emu, transport staged: NOT available: the mount's "
                      "device is 'emu'", out)
        at = out.index(f"{f}:\n")
        self.assertIn("safe_open(..., \"pt\", device='cuda:0'): safetensors reads it: the mount's device is 'emu', "
                      "not an NVIDIA GPU", out[at:])
        self.assertIn("device='cpu'): safetensors reads it: device 'cpu': host tensors", out[at:])
        self.assertIn(f"{off}:\n  safe_open(..., \"pt\", device='cuda:0'): safetensors reads it: not a FUSE "
                      "file system", out)
        d = out[out.index(f"{self.m.mnt}:\n"):]
        for name in ("m.safetensors", "n.safetensors", "bad.safetensors"):
            self.assertIn(f"  {name}: safe_open(", d)
        self.assertIn("bad.safetensors: safe_open(..., \"pt\", device='cuda:0'): safetensors reads it (and says "
                      "what it makes of it): the header", d)
        self.assertIn("/nonexistent:\n  no such file or directory", out)
        self.assertNotIn("Traceback", r.stderr)

    def test_the_hook_off_and_cpu_to(self):
        f = self.m.path("m.safetensors")
        r = run_check(["check", f])
        self.assertEqual(r.returncode, 1)
        self.assertIn("device='cuda:0'): safetensors reads it: the hook is off", r.stdout)
        r = run_check(["check", "--device", "cuda:3", f], PHXMOUNT_HOOK="cuda:1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("mode: PHXMOUNT_HOOK='cuda:1': on; tensors asked for on the cpu land on cuda:1", r.stdout)
        self.assertIn("device='cuda:3'): safetensors reads it:", r.stdout)
        self.assertIn("device='cpu'): safetensors reads it: ", r.stdout)

    def test_it_turns_nothing_on(self):
        code = ("import sys, phxmount.__main__ as m; m.main(['check', sys.argv[1]]); "
                "print('imported', sorted(x for x in sys.modules if x in ('phxmount.hook', 'torch')))")
        e = {k: v for k, v in os.environ.items() if not k.startswith("PHXMOUNT_HOOK")}
        e.update(PYTHONPATH=os.pathsep.join([self.pkgs, PYDIR]), PHXMOUNT_HOOK="1")
        r = subprocess.run([sys.executable, "-c", code, self.m.path("m.safetensors")], env=e, capture_output=True,
                           text=True, timeout=60)
        self.assertIn("imported []", r.stdout, r.stderr)

    def test_a_load_the_hook_would_serve(self):
        out = io.StringIO()
        ok = Availability(True, "NVIDIA H200 cuda:0 (stands in)", on_mount=True, vendor="nvidia", transport="staged")
        with mock.patch.dict(os.environ, {"PHXMOUNT_HOOK": "1"}), mock.patch.object(check, "available",
                                                                                   return_value=ok):
            status = check.report([self.m.path("m.safetensors")], 0, out)
        self.assertEqual(status, 0, out.getvalue())
        self.assertIn("device='cuda:0'): through phxmount onto cuda:0, transport staged: NVIDIA H200 cuda:0",
                      out.getvalue())
        out = io.StringIO()
        with mock.patch.dict(os.environ, {"PHXMOUNT_HOOK": "cuda:2"}), mock.patch.object(check, "available",
                                                                                        return_value=ok):
            check.report([self.m.path("m.safetensors")], 0, out)
        self.assertIn("device='cpu'): through phxmount onto cuda:2 (PHXMOUNT_HOOK=cuda:2)", out.getvalue())


if __name__ == "__main__":
    unittest.main()
