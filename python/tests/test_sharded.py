import json
import os
import tempfile
import unittest

from phxmount.sharded import assign_devices, shard_files


class ShardFilesTest(unittest.TestCase):
    def test_index_json_lists_each_shard_once_in_order(self):
        with tempfile.TemporaryDirectory() as d:
            idx = os.path.join(d, "model.safetensors.index.json")
            with open(idx, "w") as f:
                json.dump({"weight_map": {"a": "model-00002-of-00002.safetensors",
                                          "b": "model-00001-of-00002.safetensors",
                                          "c": "model-00002-of-00002.safetensors"}}, f)
            want = [os.path.join(d, "model-00001-of-00002.safetensors"),
                    os.path.join(d, "model-00002-of-00002.safetensors")]
            self.assertEqual(shard_files(idx), want)
            self.assertEqual(shard_files(d), want)  # a directory with an index uses it

    def test_directory_without_index(self):
        with tempfile.TemporaryDirectory() as d:
            for n in ("b.safetensors", "a.safetensors", "notes.txt"):
                open(os.path.join(d, n), "w").close()
            self.assertEqual(shard_files(d), [os.path.join(d, "a.safetensors"), os.path.join(d, "b.safetensors")])
            os.remove(os.path.join(d, "a.safetensors"))
            os.remove(os.path.join(d, "b.safetensors"))
            with self.assertRaises(FileNotFoundError):
                shard_files(d)

    def test_index_without_weight_map_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            idx = os.path.join(d, "x.safetensors.index.json")
            with open(idx, "w") as f:
                json.dump({"metadata": {}}, f)
            with self.assertRaises(ValueError):
                shard_files(idx)

    def test_assign_round_robin(self):
        files = ["s0", "s1", "s2", "s3", "s4"]
        self.assertEqual(assign_devices(files, [0, 1]), [("s0", 0), ("s1", 1), ("s2", 0), ("s3", 1), ("s4", 0)])
        self.assertEqual(assign_devices(files[:1], [3, 5]), [("s0", 3)])
        with self.assertRaises(ValueError):
            assign_devices(files, [])


if __name__ == "__main__":
    unittest.main()
