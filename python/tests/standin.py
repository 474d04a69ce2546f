# SPDX-License-Identifier: Apache-2.0
"""The C CUDA stand-in (internal/cuda/standin) for the client's tests:
built with the system compiler, loaded through the client's own library
discovery (NVFEED_CUDA_LIB_DIR), its per-process reports read back; and
the few driver calls a test needs on top of the client's (device memory
made and exported as the daemon does, copies to check bytes, streams)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from nvfeed._cuda import _call, _PrimaryContext

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "internal" / "cuda" / "standin" / "csrc" / "build.sh"
GRAN = 2 << 20
ZERO_LIVE = {"allocations": 0, "imports": 0, "reservations": 0, "mappings": 0, "handles": 0, "primary_ctx_retains": 0,
             "host_registrations": 0, "streams": 0, "events": 0, "cufile_handles": 0, "cufile_buffers": 0}


def build(out: Path) -> Path:
    """Builds the stand-in's libraries into out (a C compiler is required:
    scripts/deps.sh installs one; its absence is a failure, not a skip)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        raise AssertionError("no C compiler to build the CUDA stand-in (scripts/deps.sh installs gcc)")
    r = subprocess.run(["bash", str(BUILD), str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"building the CUDA stand-in: {r.stdout}{r.stderr}"
    assert (out / "libcuda.so.1").exists()
    return out


def env(lib: Path, report: Path, visible: str) -> dict[str, str]:
    """This process's environment less any CUDA or cuFile setting, plus
    what loads the stand-in in lib (reports to report, GPUs seen as
    visible) and the client from python/."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "CUFILE_"))}
    e.update({"NVFEED_CUDA_LIB_DIR": str(lib), "CUDA_STANDIN_REPORT": str(report), "CUDA_VISIBLE_DEVICES": visible,
              "PYTHONPATH": str(REPO / "python")})
    e.update(cufile_host(report.parent / (report.name + "-cufile-host")))
    return e


def cufile_host(root: Path) -> dict[str, str]:
    """A host meeting cuFile's preconditions (the daemon's checks and the
    stand-in's cuFile read it): root/proc/modules, and a udev record with
    ID_FS_USAGE for every block device present and for the temporary
    directory's; the environment that names them."""
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "modules").write_text("ext4 1003520 1 - Live 0x0000000000000000\n")
    data = root / "udev" / "data"
    data.mkdir(parents=True, exist_ok=True)
    devs = {os.stat(tempfile.gettempdir()).st_dev}
    devs |= {os.makedev(*map(int, p.read_text().split(":"))) for p in Path("/sys/class/block").glob("*/dev")}
    for d in devs:
        (data / f"b{os.major(d)}:{os.minor(d)}").write_text("E:ID_FS_USAGE=filesystem\n")
    return {"NVFEED_CUFILE_PROC": str(root / "proc"), "NVFEED_CUFILE_UDEV": str(root / "udev")}


def reports(d: Path) -> list[dict[str, Any]]:
    """Every process's report in d."""
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]


def assert_clean(d: Path, processes: int) -> None:
    """processes reports in d, each with no violation and nothing live."""
    rs = reports(d)
    assert len(rs) == processes, [r.get("exe") for r in rs]
    for r in rs:
        assert r["violations"] == [], r
        assert r["live"] == ZERO_LIVE, r
        assert r["spinning_events"] == 0, r


class _Prop(ctypes.Structure):
    """CUmemAllocationProp (32 bytes; offsets from cuda.h)."""
    _fields_ = [("type", ctypes.c_uint32), ("requestedHandleTypes", ctypes.c_uint32), ("loc_type", ctypes.c_int),
                ("loc_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("compression", ctypes.c_uint8),
                ("rdma", ctypes.c_uint8), ("usage", ctypes.c_uint16), ("reserved", ctypes.c_uint8 * 4)]


class _Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _Access(ctypes.Structure):
    _fields_ = [("location", _Loc), ("flags", ctypes.c_int)]


class Context:
    """A device's primary context, retained; ``with ctx:`` makes it current."""

    def __init__(self, cu: Any, device: int) -> None:
        self.cu, self.device = cu, device
        self._p = _PrimaryContext(cu, device)

    def __enter__(self) -> Context:
        self._p.push()
        return self

    def __exit__(self, *exc: object) -> None:
        self._p.pop()

    def release(self) -> None:
        self._p.release()

    def call(self, name: str, *args: Any) -> None:
        _call(self.cu, name, *args)

    def write(self, ptr: int, data: bytes) -> None:
        with self:
            self.call("cuMemcpyHtoD_v2", ctypes.c_ulonglong(ptr), data, ctypes.c_size_t(len(data)))

    def read(self, ptr: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(n)
        with self:
            self.call("cuMemcpyDtoH_v2", buf, ctypes.c_ulonglong(ptr), ctypes.c_size_t(n))
        return buf.raw

    def stream(self) -> int:
        s = ctypes.c_void_p()
        with self:
            self.call("cuStreamCreate", ctypes.byref(s), 0)
        return s.value or 0

    def destroy_stream(self, s: int) -> None:
        with self:
            self.call("cuStreamSynchronize", ctypes.c_void_p(s))
            self.call("cuStreamDestroy_v2", ctypes.c_void_p(s))

    def launch_read(self, s: int, ptr: int, buf: Any, delay_us: int) -> None:
        """The consumer's "kernel" on stream s: after delay_us, copies
        len(buf) device bytes at ptr into buf."""
        with self:
            self.call("cuStandinLaunchRead", ctypes.c_void_p(s), ctypes.c_ulonglong(ptr), ctypes.c_size_t(len(buf)),
                      ctypes.c_uint(delay_us), buf)

    def sync(self, s: int) -> None:
        with self:
            self.call("cuStreamSynchronize", ctypes.c_void_p(s))


class DeviceMemory:
    """Device memory made as the daemon makes it (cuMemCreate with POSIX
    fd handles, reserved, mapped, read-write), in its own context."""

    def __init__(self, ctx: Context, size: int) -> None:
        self.ctx, self.size = ctx, size
        prop = _Prop(type=1, requestedHandleTypes=1, loc_type=1, loc_id=ctx.device, rdma=1)
        h, ptr = ctypes.c_ulonglong(), ctypes.c_ulonglong()
        with ctx:
            ctx.call("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0))
            ctx.call("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                     ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
            ctx.call("cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0))
            access = _Access(_Loc(1, ctx.device), 3)
            ctx.call("cuMemSetAccess", ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1))
        self.handle, self.ptr = h, ptr.value

    def export(self) -> int:
        """A new descriptor of the memory (the caller closes it)."""
        fd = ctypes.c_int()
        with self.ctx:
            self.ctx.call("cuMemExportToShareableHandle", ctypes.byref(fd), self.handle, 1, ctypes.c_ulonglong(0))
        return fd.value

    def free(self) -> None:
        with self.ctx:
            self.ctx.call("cuMemUnmap", ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size))
            self.ctx.call("cuMemAddressFree", ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size))
            self.ctx.call("cuMemRelease", self.handle)
