"""The hook as an exact adapter over the installed safetensors (issue 26
item 3), without torch or a GPU:

* safe_open's device argument read as safetensors reads it ("cuda" is
  cuda:0, not the current device; " cuda", "CUDA" and torch.device objects
  are safetensors' to refuse);
* in fresh interpreters, against stand-in packages of the 0.4 signature
  (no backend=), 0.8's (backend=, pyo3's `...` defaults), a newer one (a
  prefetch= keyword) and one whose signature cannot be read: every call, with
  the hook on, gets exactly what it gets with the hook off, errors
  included;
* on a real emu mount: a served file has the installed release's methods
  and no others, the real object is opened with the caller's own
  arguments, an unknown keyword or method goes to safetensors (said once),
  metadata() is None or {} as safetensors answers, a stepped slice (and,
  with the pread backend, an index safetensors' own indexer refuses) gives
  what the installed release gives, errors included, and a closed file
  answers as safetensors' closed file does.
"""

import os
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest

from hookutil import PYDIR, HookedCase, SafetensorError, Served, stand_in, write_tree
from mountutil import np, same

from phxmount import hook  # noqa: E402
from phxmount.hook_env import safetensors_device  # noqa: E402
from phxmount.stformat import write_file  # noqa: E402


class TorchStandIn:
    """A torch module whose current CUDA device is 1: "cuda" must not mean it."""

    def __enter__(self):
        self.saved = sys.modules.get("torch")
        t = types.ModuleType("torch")
        t.cuda = types.SimpleNamespace(current_device=lambda: 1)
        sys.modules["torch"] = t
        return t

    def __exit__(self, *a):
        if self.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = self.saved


class DeviceNamesTest(unittest.TestCase):
    def test_as_safetensors_reads_them(self):
        # safetensors' Device: "cpu", "cuda" (cuda:0), "cuda:N", an int N;
        # anything else is invalid there or another kind of device.
        with TorchStandIn():
            for d, want in (("cpu", "cpu"), (None, "cpu"), ("cuda", 0), ("cuda:2", 2), (3, 3), (0, 0),
                            (" cuda", None), ("CUDA", None), ("cuda:x", None), ("cuda:", None), ("CPU", None),
                            ("mps", None), (True, None), (-1, None), (1.0, None), (types.SimpleNamespace(), None)):
                self.assertEqual(safetensors_device(d), want, repr(d))

        class TorchDevice:  # torch.device("cuda:0") is not a str: safetensors refuses it
            def __str__(self):
                return "cuda:0"
        self.assertIsNone(safetensors_device(TorchDevice()))


# Stand-in packages for fresh interpreters: safe_open of each release records
# its arguments; safetensors.torch.load_file calls it as that release does.
RELEASES = {
    "0.4": ("filename, framework, device=\"cpu\"", None,
            "with safe_open(filename, framework=\"pt\", device=device) as f:\n"
            "        return {k: f.get_tensor(k) for k in f.keys()}"),
    "0.8": ("filename, framework, device=\"cpu\", *, backend=\"mmap\"", "(filename, framework, device=..., *, backend=...)",
            "with safe_open(filename, framework=\"pt\", device=device, backend=backend) as f:\n"
            "        return f.get_tensors()"),
    "next": ("filename, framework, device=\"cpu\", *, backend=\"mmap\", prefetch=False", None,
             "with safe_open(filename, framework=\"pt\", device=device, backend=backend) as f:\n"
             "        return f.get_tensors()"),
    "opaque": ("filename, framework, device=\"cpu\", *, backend=\"mmap\"", "opaque",
               "with safe_open(filename, framework=\"pt\", device=device, backend=backend) as f:\n"
               "        return f.get_tensors()"),
}


def package(release):
    params, sig, load = RELEASES[release]
    lines = [f"__version__ = {release!r}", "class safe_open:"]
    if sig == "opaque":
        lines.append("    __signature__ = 'not a signature'  # inspect cannot read it")
    elif sig:
        lines += ["    import inspect as _i",
                  "    _P = _i.Parameter",
                  "    __signature__ = _i.Signature([_P('filename', _P.POSITIONAL_OR_KEYWORD),"
                  " _P('framework', _P.POSITIONAL_OR_KEYWORD), _P('device', _P.POSITIONAL_OR_KEYWORD, default=...),"
                  " _P('backend', _P.KEYWORD_ONLY, default=...)])  # as pyo3 shows it"]
    lines += [f"    def __init__(self, {params}):",
              "        self.args = {k: v for k, v in locals().items() if k != 'self'}",
              "    def __repr__(self):",
              "        return f'stock {sorted(self.args.items())}'",
              "    def keys(self):",
              "        return []",
              "    def get_tensor(self, name):",
              "        raise KeyError(name)",
              "    def __enter__(self):",
              "        return self",
              "    def __exit__(self, *a):",
              "        pass"]
    if release != "0.4":
        lines += ["    def get_tensors(self):", "        return dict(self.args)"]
    load_params = "filename, device=\"cpu\"" + ("" if release == "0.4" else ", *, backend=\"mmap\"")
    torch = f"from safetensors import safe_open\ndef load_file({load_params}):\n    {load}\n"
    return {"safetensors/__init__.py": "\n".join(lines) + "\n", "safetensors/torch.py": torch}


# Each call with the hook off, then on: what it returns or raises, by type and text.
CALLS = textwrap.dedent("""
    import sys
    p = sys.argv[1]
    open(p, "wb").close()
    calls = [((p, "pt"), {}), ((p, "pt", "cuda:0"), {}), ((p, "pt"), {"device": 0}),
             ((), {"filename": p, "framework": "pt", "device": "cuda"}), ((p, "pt"), {"backend": "mmap"}),
             ((p, "pt"), {"backend": "pread"}), ((p, "pt", "cpu", "mmap"), {}), ((p, "pt"), {"prefetch": True}),
             ((p, "np"), {}), ((p,), {}), ((), {}), ((p, "pt"), {"device": " cuda"}), ((p, "PT"), {}),
             (("/nonexistent", "pt", 0), {}), ((p, "pt"), {"bogus": 1})]
    def outcome(fn, *a, **k):
        try:
            return "ok " + repr(fn(*a, **k))
        except Exception as e:
            return f"raises {type(e).__name__}: {e}"
    def run():
        import safetensors, safetensors.torch
        out = [outcome(safetensors.safe_open, *a, **k) for a, k in calls]
        out.append(outcome(safetensors.torch.load_file, p))
        out.append(outcome(safetensors.torch.load_file, p, device="cuda:1"))
        return out
    import transformers  # the hook routes cpu calls too where a loader could bind them
    off = run()
    import phxmount.hook as h
    on = run()
    for a, b, c in zip(off, on, calls + [("load_file", {}), ("load_file cuda:1", {})]):
        print(("same " if a == b else "DIFFERS ") + repr(c) + ": off " + a + " | on " + b)
""")


class ForwardingTest(unittest.TestCase):
    """A file off the mount: every call gets what it gets without the hook."""

    def test_every_release_gets_its_own_answers(self):
        for release in RELEASES:
            with self.subTest(release=release), tempfile.TemporaryDirectory(prefix="phxhook-") as d:
                write_tree(d, package(release))
                write_tree(d, {"transformers/__init__.py": ""})
                env = {k: v for k, v in os.environ.items() if k != "PHXMOUNT_HOOK"}
                env["PYTHONPATH"] = os.pathsep.join([d, PYDIR])
                r = subprocess.run([sys.executable, "-c", CALLS, os.path.join(d, "x.safetensors")], env=env,
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                lines = r.stdout.splitlines()
                self.assertEqual(len(lines), 17, r.stdout)
                self.assertEqual([x for x in lines if not x.startswith("same ")], [], r.stdout)
                self.assertNotIn("phxmount hook:", r.stderr, "nothing to say of files off a mount")


class AdapterTest(HookedCase):
    """On the emu mount, with stand-ins of several releases installed."""

    @classmethod
    def populate(cls, backing):
        super().populate(backing)
        t = [("t", "U8", (4,), b"abcd")]
        write_file(os.path.join(backing, "meta-none.safetensors"), t, metadata=None)
        write_file(os.path.join(backing, "meta-empty.safetensors"), t, metadata={})
        write_file(os.path.join(backing, "meta-kv.safetensors"), t, metadata={"k": "v"})

    def test_release_0_4(self):
        self.use(stand_in("0.4"))
        self.gpu_ok()
        f = self.fake.safe_open(self.path, "pt", device="cuda:0")
        self.assertIsInstance(f, hook.HookedFile)
        self.assertFalse(hasattr(f, "get_tensors"), "0.4 has no get_tensors")
        self.assertFalse(hasattr(f, "offset_keys"), "0.4 has no offset_keys")
        self.assertEqual(f.keys(), sorted(self.arrays))
        for n, want in self.arrays.items():
            self.assertTrue(same(f.get_tensor(n), want), n)
        self.assertEqual(Served.tensors, 0, "through phxmount")
        self.assertEqual(Served.opens, [], "the real one is not opened for GPU reads")
        f.stock()
        self.assertEqual(Served.opens, [((self.path, "pt"), {"device": "cuda:0"})], "not the caller's arguments")
        with self.assertRaises(TypeError):  # 0.4 takes no backend=: its own TypeError
            self.fake.safe_open(self.path, "pt", device="cuda:0", backend="mmap")
        f.__exit__(None, None, None)

    def test_release_0_8_with_pread(self):
        self.use(stand_in("0.8"))
        self.gpu_ok()
        b0 = self.batches()
        with self.fake.safe_open(self.path, "pt", device="cuda:0", backend="pread") as f:
            self.assertIsInstance(f, hook.HookedFile)
            self.assertEqual(f.offset_keys(), [t.name for t in self.header.tensors])
            a = self.arrays["a.w"]
            self.assertTrue(same(f.get_slice("a.w")[1:3], a[1:3]))
            self.assertTrue(same(f.get_slice("a.w")[2, 5:9], a[2, 5:9]))
            self.assertEqual(Served.tensors, 0)
            self.assertGreater(self.batches(), b0)
            # What safetensors' own indexer (pread) does with what torch's takes:
            with self.assertRaises(OverflowError):
                f.get_slice("a.w")[-2:]
            with self.assertRaises(SafetensorError):
                f.get_slice("a.w")[None]
            self.assertTrue(same(np.asarray(f.get_slice("a.w")[..., 3]), a[..., 3]))
            self.assertEqual(Served.opens[-1], ((self.path, "pt"), {"device": "cuda:0", "backend": "pread"}))
        got = self.fake.safe_open(self.path, "pt", device="cuda:0", backend="bogus")
        self.assertNotIsInstance(got, hook.HookedFile, "a backend phxmount does not know is safetensors' to judge")

    def test_an_unknown_keyword_goes_to_safetensors(self):
        self.use(stand_in("next"))
        self.gpu_ok()
        for _ in range(2):
            got = self.fake.safe_open(self.path, "pt", device="cuda:0", prefetch=True)
            self.assertNotIsInstance(got, hook.HookedFile)
            self.assertEqual(Served.opens[-1], ((self.path, "pt"), {"device": "cuda:0", "prefetch": True}))
        said = self.err.getvalue()
        self.assertEqual(said.count("argument prefetch"), 1, said)

    def test_an_unknown_method_hands_the_file_over(self):
        self.use(stand_in("next"))
        self.gpu_ok()
        f = self.fake.safe_open(self.path, "pt", device="cuda:0")
        self.assertTrue(same(f.get_tensor("a.w"), self.arrays["a.w"]))
        self.assertEqual((Served.tensors, Served.opens), (0, []))
        self.assertFalse(hasattr(f, "no_such_method"))
        self.assertEqual(Served.opens, [], "a probe of a name the release lacks opens nothing")
        f.prefetch_tensors(["b.w"])
        f.prefetch_tensors(["c.bias"])
        self.assertEqual(Served.calls, [("prefetch_tensors", ["b.w"]), ("prefetch_tensors", ["c.bias"])])
        self.assertEqual(Served.opens, [((self.path, "pt"), {"device": "cuda:0"})])
        self.assertEqual(self.err.getvalue().count("prefetch_tensors()"), 1, self.err.getvalue())
        self.assertTrue(same(np.asarray(f.get_tensor("b.w")), self.arrays["b.w"]))
        self.assertEqual(Served.tensors, 1, "the file is safetensors' once a method of its own was called")
        self.assertEqual(self.readers[0]._landing, {}, "what phxmount read ahead was kept")
        f.__exit__(None, None, None)

    def test_a_signature_inspect_cannot_read(self):
        self.use(stand_in("opaque"))
        self.gpu_ok()
        f = self.fake.safe_open(self.path, "pt", device="cuda:0")
        self.assertIsInstance(f, hook.HookedFile, "(filename, framework, device) is every release's")
        self.assertTrue(same(f.get_tensor("a.w"), self.arrays["a.w"]))
        got = self.fake.safe_open(self.path, "pt", device="cuda:0", backend="mmap")
        self.assertNotIsInstance(got, hook.HookedFile)
        self.assertIn("signature was not read", self.err.getvalue())
        f.__exit__(None, None, None)

    def test_cuda_is_cuda0(self):
        self.gpu_ok(0)
        with TorchStandIn():
            with self.fake.safe_open(self.path, "pt", device="cuda") as f:
                self.assertTrue(same(f.get_tensor("a.w"), self.arrays["a.w"]))
        self.assertEqual(self.reader_devs, [0])
        self.assertEqual(Served.tensors, 0)
        for dev in (" cuda", "CUDA", "cuda:x", types.SimpleNamespace()):
            self.assertNotIsInstance(self.fake.safe_open(self.path, "pt", device=dev), hook.HookedFile, dev)
        self.assertNotIsInstance(self.fake.safe_open(self.path, "PT", device="cuda:0"), hook.HookedFile)

    def test_metadata_as_safetensors(self):
        self.gpu_ok()
        for name, want in (("meta-none", None), ("meta-empty", {}), ("meta-kv", {"k": "v"})):
            with self.fake.safe_open(self.m.path(name + ".safetensors"), "pt", device="cuda:0") as f:
                self.assertIsInstance(f, hook.HookedFile)
                self.assertEqual(f.metadata(), want, name)
                self.assertEqual(f.metadata(), f.stock().metadata(), name)

    def test_stepped_slices_as_the_release(self):
        self.gpu_ok()
        a = self.arrays["a.w"]
        for steps in (True, False):
            self.use(stand_in("0.8", steps=steps))
            with self.fake.safe_open(self.path, "pt", device="cuda:0") as f:
                for idx in ((slice(None, None, 2),), (slice(None), slice(1, 9, 3))):
                    if steps:
                        self.assertTrue(same(np.ascontiguousarray(f.get_slice("a.w")[idx]),
                                             np.ascontiguousarray(a[idx])), idx)
                    else:
                        with self.assertRaises(SafetensorError, msg=idx):
                            f.get_slice("a.w")[idx]
                self.assertTrue(same(f.get_slice("a.w")[1:9], a[1:9]), "a step-less slice is phxmount's")
                got = f.get_slice("a.w")[None]
                self.assertTrue(same(got, a[None]), "[None] is a new axis, not the whole tensor")

    def test_a_closed_file_answers_as_safetensors(self):
        self.gpu_ok()
        f = self.fake.safe_open(self.path, "pt", device="cuda:0")
        s = f.get_slice("a.w")
        f.__exit__(None, None, None)
        for method, args in (("keys", ()), ("metadata", ()), ("get_tensor", ("a.w",)), ("get_slice", ("a.w",))):
            with self.assertRaises(SafetensorError, msg=method):
                getattr(f, method)(*args)
        self.assertTrue(same(s[0:2], self.arrays["a.w"][0:2]), "a slice outlives its file, as safetensors'")


if __name__ == "__main__":
    unittest.main()
