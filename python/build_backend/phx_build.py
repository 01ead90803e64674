"""A PEP 517 build backend for the phxmount Python package, small enough to
live in the tree: the package is pure Python (phxmount/*.py and py.typed),
so a wheel is a zip of those files and its metadata. No build dependency
means `pip install ./python` needs no package index."""

import base64
import hashlib
import io
import os
import tarfile
import tomllib
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "phxmount"
# Installed beside the package: turns the safetensors hook on at interpreter
# start when PHXMOUNT_HOOK is set (phxmount/hook.py).
PTH = "phxmount-hook.pth"


def _project() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _metadata(p: dict) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p['description']}", f"Requires-Python: {p['requires-python']}",
             f"License: {p['license']}"]
    for extra, reqs in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {r}; extra == \"{extra}\"" for r in reqs]
    with open(os.path.join(ROOT, p["readme"]), encoding="utf-8") as f:
        lines += ["Description-Content-Type: text/markdown", "", f.read()]
    return "\n".join(lines) + "\n"


def _package_files() -> list:
    src = os.path.join(ROOT, PACKAGE)
    return sorted(n for n in os.listdir(src) if n.endswith(".py") or n == "py.typed")


def _read(rel: str) -> bytes:
    with open(os.path.join(ROOT, rel), "rb") as f:
        return f.read()


def _dist_info(p: dict) -> str:
    return f"{p['name']}-{p['version']}.dist-info"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p = _project()
    d = os.path.join(metadata_directory, _dist_info(p))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(p))
    return _dist_info(p)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    p = _project()
    name = f"{p['name']}-{p['version']}-py3-none-any.whl"
    files = [(f"{PACKAGE}/{n}", _read(os.path.join(PACKAGE, n))) for n in _package_files()] + [(PTH, _read(PTH))]
    di = _dist_info(p)
    files.append((f"{di}/METADATA", _metadata(p).encode()))
    files.append((f"{di}/WHEEL", b"Wheel-Version: 1.0\nGenerator: phx_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    record = [_record_line(n, d) for n, d in files] + [f"{di}/RECORD,,"]
    files.append((f"{di}/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            z.writestr(n, d)
    return name


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = f"{p['name']}-{p['version']}"
    name = f"{base}.tar.gz"
    members = ["pyproject.toml", p["readme"], "build_backend/phx_build.py", PTH] + \
        [f"{PACKAGE}/{n}" for n in _package_files()]
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for m in members:
            t.add(os.path.join(ROOT, m), arcname=f"{base}/{m}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata(p).encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return name
