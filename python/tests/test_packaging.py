"""pip install ./python gives an importable phxmount with its version and
type marker, offline (the build backend is in the tree)."""

import os
import subprocess
import sys
import tempfile
import tomllib
import unittest

PY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PackagingTest(unittest.TestCase):
    def test_pip_install_into_a_fresh_venv(self):
        with open(os.path.join(PY, "pyproject.toml"), "rb") as f:
            version = tomllib.load(f)["project"]["version"]
        import phxmount
        self.assertEqual(phxmount.__version__, version, "phxmount.__version__ and pyproject.toml disagree")
        with tempfile.TemporaryDirectory() as d:
            venv = os.path.join(d, "venv")
            r = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
            if r.returncode != 0 and "ensurepip" in r.stdout + r.stderr:
                self.skipTest(f"this python ({sys.executable}) makes no venv with pip: no ensurepip")
            self.assertEqual(r.returncode, 0, r.stderr)
            py = os.path.join(venv, "bin", "python")
            r = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-cache-dir", "-q", PY],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = subprocess.run([py, "-c", "import os, phxmount; print(phxmount.__version__); "
                                  "print(os.path.exists(os.path.join(os.path.dirname(phxmount.__file__), 'py.typed')));"
                                  "print(phxmount.__file__)"], cwd=d, capture_output=True, text=True, check=True)
            got_version, typed, path = out.stdout.split()
            self.assertEqual(got_version, version)
            self.assertEqual(typed, "True", "py.typed is not installed")
            self.assertTrue(path.startswith(venv), f"imported from {path}, not the venv")
            # phxmount-hook.pth: the hook at interpreter start when PHXMOUNT_HOOK says so, nothing otherwise.
            probe = "import sys; print(sorted(m for m in sys.modules if m.startswith('phxmount')))"
            for value, want in (("1", "['phxmount', 'phxmount.abi'"), ("0", "[]"), (None, "[]")):
                env = {k: v for k, v in os.environ.items() if k != "PHXMOUNT_HOOK"}
                if value is not None:
                    env["PHXMOUNT_HOOK"] = value
                out = subprocess.run([py, "-c", probe], cwd=d, env=env, capture_output=True, text=True, check=True)
                self.assertTrue(out.stdout.startswith(want), (value, out.stdout, out.stderr))
                self.assertEqual("phxmount.hook" in out.stdout, value == "1", (value, out.stdout))
            # python -m phxmount check says where the .pth is and what the environment makes of it.
            env = {k: v for k, v in os.environ.items() if k != "PHXMOUNT_HOOK"}
            out = subprocess.run([py, "-m", "phxmount", "check"], cwd=d, env=dict(env, PHXMOUNT_HOOK="1"),
                                 capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            self.assertIn(f"hook: phxmount-hook.pth installed at {os.path.join(site, 'phxmount-hook.pth')}", out.stdout)
            self.assertIn("mode: PHXMOUNT_HOOK='1': on", out.stdout)
            self.assertIn("phxmount.hook is active in this interpreter", out.stdout)


if __name__ == "__main__":
    unittest.main()
