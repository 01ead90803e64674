"""python -m phxmount [check [PATH...]]: what the safetensors hook would do
here, and why (phxmount.check). Exit status 0, 1 (a PATH the hook would not
serve, an invalid PHXMOUNT_HOOK), or 2 (bad usage)."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .check import report
from .hook_env import safetensors_device


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m phxmount",
                                 description="What phxmount's safetensors hook would do here, and why.")
    sub = ap.add_subparsers(dest="command", metavar="check")
    c = sub.add_parser("check", help="the hook's installation, mode and mounts, and what a load of each PATH "
                                     "would do (the default command)",
                       description="What phxmount's safetensors hook would do here, and why: the installed "
                                   "safetensors and torch, the .pth hook and PHXMOUNT_HOOK's mode, every "
                                   "phxmount mount, and for each PATH (a file, or a directory's .safetensors "
                                   "files) what a load would do. Exit status 0 when every PATH would be read "
                                   "through phxmount, 1 when one would not (or PHXMOUNT_HOOK is invalid).")
    c.add_argument("paths", nargs="*", metavar="PATH")
    c.add_argument("--device", default="cuda:0",
                   help="the device a load asks for, as safetensors names it: cuda, cuda:N or N (default cuda:0)")
    args = ap.parse_args(["check"] if argv == [] or (argv is None and len(sys.argv) == 1) else argv)
    dev = safetensors_device(args.device)
    if not isinstance(dev, int):
        c.error(f"--device {args.device!r}: want cuda, cuda:N or N, as safetensors names a CUDA device")
    return report(args.paths, dev, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
