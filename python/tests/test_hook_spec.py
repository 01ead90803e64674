"""hook_spec.OpenFiles on its own, no mount: bound_to gives the files
with binds onto a device in the order they were opened, each once per
bind, and nothing once no bind is left (it is asked at every read)."""

import unittest

from phxmount.hook_spec import OpenFiles, Speculation


class File:
    """A hooked file as OpenFiles sees it (weakly held, with its spec)."""

    def __init__(self, name: str):
        self.name, self.spec = name, Speculation()

    def __repr__(self):
        return self.name


def opened(files: OpenFiles, n: int):
    out = [File(f"f{i}") for i in range(n)]
    for f in out:
        files.add(f)
    return out


class BoundToTest(unittest.TestCase):
    def test_in_the_order_opened_once_a_bind(self):
        files = OpenFiles()
        a, b, c = opened(files, 3)
        self.assertEqual(files.bound_to(0), [])
        files.bind(c, 0)
        files.bind(a, 0)
        files.bind(b, 1)
        self.assertEqual(files.bound_to(0), [a, c])
        self.assertEqual(files.bound_to(0), [], "a bind is started once")
        self.assertTrue(files.marked, "a bind onto another device is left")
        self.assertEqual(files.bound_to(1), [b])
        self.assertFalse(files.marked)
        files.bind(a, 1)
        self.assertEqual(files.bound_to(1), [a], "a later bind marks a file again")

    def test_a_collected_file_is_gone(self):
        files = OpenFiles()
        a, b = opened(files, 2)
        files.bind(a, 0)
        files.bind(b, 0)
        del a
        self.assertEqual(files.bound_to(0), [b])


if __name__ == "__main__":
    unittest.main()
