"""The package's modules form layers (python/README.md's table): each
imports only modules of the layers below it, at the top or inside a
function alike, so there is no import cycle (issue 19)."""

import ast
import os
import unittest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "phxmount")

# Lowest first; a module may import only modules of earlier layers.
LAYERS = [
    ["abi", "cuda", "stformat", "extents", "dtypes", "deferred", "threadpools"],
    ["client", "slicing", "sharded"],
    ["plans"],
    ["batchio", "regcache", "loader", "availability"],
    ["fetch"],
    ["safeopen"],
    ["savefile", "hostbackends"],
    ["torch_mem"],
    ["torch_load", "torch_save"],
    ["hook_env", "hook_report", "hook_close", "hook_warm"],
    ["hook_route", "hook_plan", "hook_import"],
    ["hook_ahead", "hook_guess", "hook_slice", "hook_whole", "hook_spec", "hook_fileroute"],
    ["hook_defer", "hook_next"],
    ["replicate", "hook"],
    ["check"],  # below hook in what it knows, above it so that it never imports it
    ["__init__", "__main__"],
]


def imports_of(path: str):
    """The package modules a module imports (relative imports), anywhere in it."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
    return out


class LayersTest(unittest.TestCase):
    def test_every_module_has_a_layer(self):
        mods = {f[:-3] for f in os.listdir(PKG) if f.endswith(".py")}
        placed = {m for layer in LAYERS for m in layer}
        self.assertEqual(mods - placed, set(), "modules without a layer in LAYERS")
        self.assertEqual(placed - mods, set(), "LAYERS names modules that do not exist")

    def test_imports_go_down_only(self):
        level = {m: i for i, layer in enumerate(LAYERS) for m in layer}
        bad = []
        for m, i in level.items():
            for dep in imports_of(os.path.join(PKG, m + ".py")):
                if dep not in level:
                    bad.append(f"{m} imports {dep}, which has no layer")
                elif level[dep] >= i:
                    bad.append(f"{m} (layer {i}) imports {dep} (layer {level[dep]})")
        self.assertEqual(bad, [])

    def test_no_module_over_450_lines(self):
        # Issue 27, item 6: one place per concern, no file over 450 lines.
        long = {}
        for name in os.listdir(PKG):
            if name.endswith(".py"):
                with open(os.path.join(PKG, name)) as f:
                    n = sum(1 for _ in f)
                if n > 450:
                    long[name] = n
        self.assertEqual(long, {})


if __name__ == "__main__":
    unittest.main()
