"""python -m phxmount check [PATH...]: what the safetensors hook would do
here, and why, before it serves a file. It prints the installed
safetensors (and the safe_open signature the hook binds calls to) and
torch, whether phxmount-hook.pth is installed and in which mode
PHXMOUNT_HOOK puts the hook, and, for each phxmount mount of this process's
mount table (fstype fuse.phxmount) or each PATH given, what a load would
do: the transport, the device, and whether the hook would serve it or send
it to safetensors, and why. It decides with the hook's own rules
(hook_route) and asks the daemon as the hook does (availability), without
importing the hook, so it turns nothing on. No torch is imported.

Exit status: 0 when every PATH given would be read through phxmount by a
GPU load in this environment (with no PATH: when PHXMOUNT_HOOK is valid);
1 when one would not, or PHXMOUNT_HOOK is not a valid value; 2 for bad
usage (argparse's message)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import site
import sys
from typing import List, Optional, TextIO, Tuple

from .availability import available
from .hook_defer import DEFER_ENV, defer_enabled
from .hook_next import NEXT_ENV, next_enabled
from .hook_env import ENV, TASK_ENV, WINDOW_ENV, Mode, describe, parse_mode, task, window
from .hook_spec import SPECULATE_ENV, speculate_enabled
from .hook_route import FUSE_SUPER_MAGIC, Call, Installed, decide, statfs_type
from .stformat import SafetensorsError, read_header

PTH = "phxmount-hook.pth"
FSTYPE = "fuse.phxmount"  # what go-fuse's mount shows for phxmount (fusefs: Name "phxmount")


def package(name: str) -> str:
    """name's version and where it is, without importing it; or "not installed"."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "not installed"
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = "(no version: not installed as a distribution)"
    where = os.path.dirname(spec.origin) if spec.origin else ", ".join(spec.submodule_search_locations or [])
    return f"{version} ({where})"


def installed_safe_open() -> Tuple[Optional[Installed], str]:
    """The installed safetensors' safe_open as the hook would adapt it (the
    hook's own, where it is active here), or why there is none."""
    hook = sys.modules.get("phxmount.hook")
    if hook is not None and getattr(hook, "_installed", None) is not None:
        return hook._installed, ""
    try:
        import safetensors
    except Exception as e:  # noqa: BLE001: a broken install says so
        return None, f"import safetensors fails: {e.__class__.__name__}: {e}"
    real = getattr(safetensors, "safe_open", None)
    if real is None:
        return None, "safetensors has no safe_open"
    return Installed(real, str(getattr(safetensors, "__version__", "?"))), ""


def pth_files() -> List[str]:
    """The phxmount-hook.pth files in the site directories this
    interpreter processes at start."""
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    out = []
    for d in dict.fromkeys(dirs):
        p = os.path.join(d, PTH)
        if os.path.isfile(p):
            out.append(p)
    return out


def mounts() -> List[Tuple[str, str]]:
    """(mount point, backing) of every phxmount mount in this process's
    mount table (/proc/self/mountinfo)."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if len(a) >= 5 and len(b) >= 2 and b[0] == FSTYPE:
            out.append((_unescape(a[4]), _unescape(b[1])))
    return out


def _unescape(s: str) -> str:
    """mountinfo's octal escapes (\\040 for a space)."""
    return s.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace") if "\\" in s else s


def load(path: str, device, mode: Mode) -> Tuple[bool, str]:
    """What safe_open(path, "pt", device=device) would get with the hook in
    mode: (through phxmount, why), with the hook's own rules."""
    what = f'safe_open(..., "pt", device={device!r})'
    if not mode.on:
        return False, f"{what}: safetensors reads it: the hook is off"
    r = decide(Call(path, "pt", device, "mmap"), mode, loader_binds=False)
    if not r.serve:
        return False, f"{what}: safetensors reads it: {r.why}"
    fstype = statfs_type(path)
    if fstype != FUSE_SUPER_MAGIC:
        why = "statfs failed" if fstype is None else f"not a FUSE file system (statfs f_type {fstype:#x})"
        return False, f"{what}: safetensors reads it: {why}"
    try:
        read_header(path)
    except (OSError, SafetensorsError) as e:
        return False, f"{what}: safetensors reads it (and says what it makes of it): the header: {e}"
    # device "cpu" is served only with PHXMOUNT_HOOK=cuda[:N] here: "cuda" is
    # the current device, 0 in a process that has set none.
    dev = r.device if r.device != "cpu" else (0 if mode.cpu_to == "cuda" else int(mode.cpu_to.split(":")[1]))
    av = available(path, dev)
    if not av:
        return False, f"{what}: safetensors reads it: {av.reason}"
    onto = f"cuda:{dev}" + ("" if r.device != "cpu" else f" ({ENV}={mode.cpu_to})")
    return True, f"{what}: through phxmount onto {onto}, transport {av.transport}: {av.reason}"


def report(paths: List[str], device: int, out: TextIO) -> int:
    """Prints what the hook would do of loads onto cuda:device (and the
    cpu); returns the exit status."""
    import phxmount
    status = 0
    print(f"phxmount {phxmount.__version__} ({os.path.dirname(phxmount.__file__)}), python "
          f"{sys.version.split()[0]} ({sys.executable})", file=out)
    inst, why = installed_safe_open() if importlib.util.find_spec("safetensors") else (None, "")
    print(f"safetensors: {package('safetensors')}", file=out)
    if inst is not None:
        print(f"  the hook binds calls to {inst.describe()}", file=out)
    elif why:
        print(f"  {why}", file=out)
    print(f"torch: {package('torch')}", file=out)
    pths = pth_files()
    if pths:
        print(f"hook: {PTH} installed at {', '.join(pths)}: at interpreter start it imports phxmount.hook "
              f"when {ENV} is on" + (" (but this interpreter runs without site: python -S)"
                                     if sys.flags.no_site else ""), file=out)
    else:
        print(f"hook: {PTH} is not in this interpreter's site-packages (pip install ./python installs it; "
              "import phxmount.hook in code turns the hook on without it)", file=out)
    value = os.environ.get(ENV)
    try:
        mode = parse_mode(value)
    except ValueError as e:
        print(f"mode: {e}: the hook is off", file=out)
        mode, status = Mode(False), 1
    else:
        state = f"{ENV}={value!r}" if value is not None else f"{ENV} unset"
        print(f"mode: {state}: " + (f"on; {describe(mode)}" if mode.on else f"off ({ENV}=1 turns it on)"), file=out)
    active = "phxmount.hook" in sys.modules
    print(f"  phxmount.hook is {'active' if active else 'not imported'} in this interpreter; window "
          f"{window()} bytes a file ({WINDOW_ENV}), tasks of {task() or 'the reader default'} "
          f"({TASK_ENV}); get_tensor's deferral {'on' if defer_enabled() else 'off'} ({DEFER_ENV}); "
          f"whole files ahead of a loader's binds {'on' if speculate_enabled() else 'off'} ({SPECULATE_ENV}); "
          f"the next file of a series started before its open {'on' if next_enabled() else 'off'} ({NEXT_ENV})",
          file=out)
    seen = mounts()
    print(f"mounts ({FSTYPE} in /proc/self/mountinfo): " + ("none" if not seen else str(len(seen))), file=out)
    for mnt, backing in seen:
        av = available(mnt, device)
        how = f"device {av.vendor}, transport {av.transport}: " if av.on_mount and av.vendor else ""
        print(f"  {mnt} (over {backing}): {how}{av}", file=out)
    for p in paths:
        print(f"{p}:", file=out)
        if not os.path.exists(p):
            print("  no such file or directory", file=out)
            status = 1
            continue
        files = [p] if not os.path.isdir(p) else sorted(
            os.path.join(p, n) for n in os.listdir(p) if n.endswith(".safetensors"))
        if not files:
            print("  no .safetensors file in it", file=out)
            status = 1
        for f in files:
            gpu, why = load(f, f"cuda:{device}", mode)
            status = status if gpu else 1
            print(f"  {os.path.basename(f) + ': ' if f != p else ''}{why}", file=out)
            cpu, why = load(f, "cpu", mode)
            if not cpu and mode.on and mode.cpu_to is None:
                why += "; what transformers' from_pretrained binds to a GPU goes as device='cuda:N' does"
            print(f"    {why}", file=out)
    return status
