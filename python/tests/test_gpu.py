# SPDX-License-Identifier: Apache-2.0
"""The GPU client without a GPU: the CUDA array objects field by field,
libcuda's discovery, and the import, close and lifetime of a VMM mapping
and the release fence against a strict recording libcuda double
(tests/fakecuda.py); test_standin.py runs the same against the C
stand-in, and bench/gpu.sh on a GPU machine."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fakecuda import FakeCuda, uuid_bytes
from nvfeed import BadRequestError, CudaArray
from nvfeed._cuda import (CU_STREAM_LEGACY, LIB_DIR_ENV, CudaError, device_uuid, find_device, format_uuid,
                          load_libcuda, stream_handle)
from nvfeed._cudamem import DeviceMapping
from nvfeed._fence import ReleaseFence

TESTS = Path(__file__).resolve().parent
ZERO = {"primary_ctx_retains": 0, "imports": 0, "reservations": 0, "mappings": 0, "events": 0, "pushed": 0}


def clean(cu: FakeCuda) -> None:
    """Nothing held, nothing done against CUDA's rules."""
    assert cu.violations == []
    assert cu.live() == ZERO


def test_cuda_array_interface_fields() -> None:
    owner = object()
    a = CudaArray(0x7F00_0000_1000, 12345, 3, owner)
    cai = a.__cuda_array_interface__
    assert set(cai) == {"shape", "typestr", "data", "version", "strides", "stream"}
    assert cai["shape"] == (12345,) and isinstance(cai["shape"], tuple)
    assert cai["typestr"] == "|u1"
    assert cai["data"] == (0x7F00_0000_1000, False)  # writable: torch refuses read-only
    assert cai["version"] == 3
    assert cai["strides"] is None  # contiguous
    assert cai["stream"] is None  # the daemon waited for its copy; 0 would be refused
    assert len(a) == 12345 and a.shape == (12345,) and a.nbytes == 12345 and a.device == 3


@pytest.mark.parametrize("shape,typestr,nbytes", [((4, 1000), "|u1", 4000), ((2, 3, 5), "<f4", 120), ((7,), "|u1", 7),
                                                  ((0, 5), "<u2", 0), ((3,), "<c16", 48), ((2, 2), "|b1", 4)])
def test_cuda_array_nd(shape: tuple[int, ...], typestr: str, nbytes: int) -> None:
    """A dense batch: one C-contiguous array of shape (batch, size); a
    numpy dataset's array of its dtype and shape."""
    a = CudaArray(0x1000, shape, 0, None, typestr=typestr)
    cai = a.__cuda_array_interface__
    assert cai["shape"] == shape and cai["typestr"] == typestr and cai["strides"] is None
    assert a.nbytes == nbytes and len(a) == shape[0]


def test_cuda_array_0d() -> None:
    """A 0-d array (np.save of a scalar): shape (), one element, no len()."""
    a = CudaArray(0x1000, (), 0, None, typestr="<i8")
    assert a.__cuda_array_interface__["shape"] == () and a.nbytes == 8
    with pytest.raises(TypeError, match="0-d"):
        len(a)


@pytest.mark.parametrize("shape,typestr", [((2, -1), "|u1"), ((2.0, 3), "|u1"), ((4,), "|u"), ((4,), "<f0")])
def test_cuda_array_rejects(shape: Any, typestr: str) -> None:
    with pytest.raises(ValueError, match="CudaArray"):
        CudaArray(0x1000, shape, 0, None, typestr=typestr)


def test_discovery_explicit_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVFEED_CUDA_LIB_DIR wins: libcuda.so.1 is loaded from there (a
    stand-in library here: libm), and a missing one is named with the
    variable when the dynamic loader has none either."""
    with open("/proc/self/maps") as maps:  # this process's libc: a library that surely loads
        path = next(l.split()[-1] for l in maps if l.rstrip().endswith("/libc.so.6"))
    (tmp_path / "libcuda.so.1").symlink_to(path)
    monkeypatch.setenv(LIB_DIR_ENV, str(tmp_path))
    lib = load_libcuda()
    assert lib._name == str(tmp_path / "libcuda.so.1")
    monkeypatch.setenv(LIB_DIR_ENV, str(tmp_path / "none"))
    try:
        ctypes.CDLL("libcuda.so.1")
        return  # the system's driver: the fallback finds it (test_libcuda_from_the_system_when_the_lib_dir_lacks_it)
    except OSError:
        pass
    with pytest.raises(CudaError, match=rf"no NVIDIA driver found: libcuda.so.1 is not in the dynamic loader's path "
                                        rf"\({LIB_DIR_ENV}={tmp_path}/none holds no libcuda.so.1\)"):
        load_libcuda()


def test_discovery_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIB_DIR_ENV, raising=False)
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("libcuda.so.1 loads here")
    except OSError:
        pass
    with pytest.raises(CudaError, match=rf"no NVIDIA driver found: libcuda.so.1 is not in the dynamic loader's path "
                                        rf"\({LIB_DIR_ENV} is not set\)"):
        load_libcuda()
    monkeypatch.setenv(LIB_DIR_ENV, "")  # empty is unset
    with pytest.raises(CudaError, match="not in the dynamic loader's path"):
        load_libcuda()


IMPORT = ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent_v2",
          "cuMemImportFromShareableHandle", "cuMemAddressReserve", "cuMemMap", "cuMemRelease",
          "cuMemSetAccess", "cuCtxPopCurrent_v2"]
CLOSE = ["cuCtxPushCurrent_v2", "cuCtxSynchronize", "cuMemUnmap", "cuMemAddressFree", "cuCtxPopCurrent_v2",
         "cuDevicePrimaryCtxRelease_v2"]


def test_import_sequence() -> None:
    cu = FakeCuda()
    m = DeviceMapping(17, 1 << 21, 1, lib=cu)
    assert m.ptr in cu.mappings and m.size == 1 << 21 and m.device == 1
    assert cu.names() == IMPORT
    args = dict(cu.calls)
    assert args["cuMemImportFromShareableHandle"][1].value == 17  # the descriptor, passed as the pointer
    assert args["cuMemImportFromShareableHandle"][2] == 1  # POSIX file descriptor
    desc = args["cuMemSetAccess"][2]._obj
    assert (desc.location.type, desc.location.id, desc.flags) == (1, 1, 3)  # device 1, read-write
    assert args["cuMemMap"][1].value == 1 << 21
    assert cu.live() == {**ZERO, "primary_ctx_retains": 1, "reservations": 1, "mappings": 1}
    n = len(cu.calls)
    m.close()
    assert cu.names()[n:] == CLOSE  # the context current around the unmap, and given back once
    clean(cu)
    m.close()  # twice is a no-op
    assert len(cu.calls) == n + len(CLOSE) and m.closed and m.ptr == 0


@pytest.mark.parametrize("fail", ["cuMemUnmap", "cuMemAddressFree", "cuCtxSynchronize", "cuCtxPopCurrent_v2",
                                  "cuDevicePrimaryCtxRelease_v2"])
def test_close_failure_is_raised_after_the_rest(fail: str) -> None:
    """A failing step raises CudaError naming it, after every other step
    ran (nothing else left held); the retain is released once."""
    cu = FakeCuda()
    m = DeviceMapping(17, 1 << 21, 0, lib=cu)
    n = len(cu.names())
    cu.fail[fail] = 999
    with pytest.raises(CudaError, match=rf"^{fail}: CUDA_ERROR_UNKNOWN \(999\)$") as e:
        m.close()
    assert e.value.call == fail and e.value.code == 999
    want = [c for c in CLOSE if not (fail == "cuMemUnmap" and c == "cuMemAddressFree")]  # still mapped: not freed
    assert cu.names()[n:] == want
    assert cu.names().count("cuDevicePrimaryCtxRelease_v2") == 1
    assert cu.violations == []
    m.close()  # no second attempt
    assert len(cu.names()) == n + len(want)


def test_close_names_every_failure() -> None:
    cu = FakeCuda()
    m = DeviceMapping(17, 1 << 21, 0, lib=cu)
    cu.fail.update(cuMemUnmap=2, cuDevicePrimaryCtxRelease_v2=999)
    with pytest.raises(CudaError, match=r"^cuMemUnmap: CUDA_ERROR_OUT_OF_MEMORY \(2\); then "
                                        r"cuDevicePrimaryCtxRelease_v2: CUDA_ERROR_UNKNOWN \(999\)$"):
        m.close()


@pytest.mark.parametrize("fail", ["cuMemImportFromShareableHandle", "cuMemAddressReserve", "cuMemMap", "cuMemRelease",
                                  "cuMemSetAccess", "cuCtxPushCurrent_v2"])
def test_import_failure_names_the_call_and_cleans_up(fail: str) -> None:
    cu = FakeCuda(fail={fail: 2})
    with pytest.raises(CudaError, match=rf"{fail}: CUDA_ERROR_OUT_OF_MEMORY \(2\)"):
        DeviceMapping(17, 1 << 21, 0, lib=cu)
    if fail not in ("cuMemImportFromShareableHandle", "cuCtxPushCurrent_v2"):
        assert "cuMemRelease" in cu.names()  # the handle released
    assert cu.names()[-1] == "cuDevicePrimaryCtxRelease_v2"
    assert cu.violations == []
    live = cu.live()
    if fail == "cuMemRelease":  # the handle's release failed: the double still counts it
        live["imports"] -= 1
    assert live == ZERO


def test_mapping_lives_while_its_arrays_do() -> None:
    """Retired by its owner, a mapping stays until its last array dies,
    then is unmapped (context pushed); with no array, at retire()."""
    cu = FakeCuda()
    m = DeviceMapping(17, 1 << 21, 0, lib=cu)
    a = [CudaArray(m.ptr + i * 100, 100, 0, m) for i in range(3)]
    dense = CudaArray(m.ptr, (3, 100), 0, m)
    assert m.arrays == 4
    m.retire()
    assert not m.closed and len(cu.mappings) == 1
    del a[:2]
    assert not m.closed
    del dense
    a.clear()
    assert m.closed and m.arrays == 0
    clean(cu)

    m = DeviceMapping(17, 1 << 21, 0, lib=cu)
    m.retire()
    assert m.closed
    clean(cu)


def test_copies_hold_the_mapping_too() -> None:
    import copy
    import pickle
    cu = FakeCuda()
    m = DeviceMapping(17, 1 << 21, 0, lib=cu)
    a = CudaArray(m.ptr, (2, 8), 0, m)
    b, c = copy.copy(a), copy.deepcopy(a)
    assert (b.ptr, b.shape, c.shape) == (a.ptr, (2, 8), (2, 8)) and m.arrays == 3
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(a)
    m.retire()
    del a, b
    assert not m.closed
    del c
    assert m.closed
    clean(cu)


def test_mapping_collected_unmaps() -> None:
    """A mapping nobody closed is unmapped when it is collected."""
    cu = FakeCuda()
    m = DeviceMapping(17, 1 << 21, 0, lib=cu)
    a = CudaArray(m.ptr, 5, 0, m)
    del m
    gc.collect()
    assert len(cu.mappings) == 1  # the array holds it
    del a
    gc.collect()
    clean(cu)


EXIT_SCRIPT = """
import gc, sys
sys.path[:0] = [{tests!r}, {python!r}]
from fakecuda import FakeCuda
from nvfeed._cudamem import CudaArray, DeviceMapping
cu = FakeCuda()
cu.on_call = lambda name: print("call", name, flush=True)
m = DeviceMapping(17, 1 << 21, 0, lib=cu)
{body}
print("exit", flush=True)
import atexit
"""


def _run_exit(body: str) -> list[str]:
    script = EXIT_SCRIPT.format(tests=str(TESTS), python=str(TESTS.parent), body=textwrap.dedent(body))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Exception ignored" not in r.stderr and "Warning" not in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    return [l.split()[1] for l in lines[lines.index("exit") + 1:]]


@pytest.mark.parametrize("body", [
    "held = [CudaArray(m.ptr, 10, 0, m) for _ in range(3)]  # arrays alive at exit, the source's mapping too",
    "held = [CudaArray(m.ptr, (2, 5), 0, m)]; m.retire(); del m  # retired, its arrays alive at exit",
    "pass  # a mapping nobody closed",
])
def test_exit_unmaps_once_with_a_context(body: str) -> None:
    """At interpreter exit a mapping still alive is unmapped exactly once,
    with its context pushed (and nothing after that, though its arrays die
    later)."""
    assert _run_exit(body) == CLOSE


def test_uuid_and_ordinals() -> None:
    """Ordinals are this process's (here CUDA_VISIBLE_DEVICES=1,0): the
    UUID names the GPU."""
    cu = FakeCuda(gpus=[uuid_bytes(1), uuid_bytes(0)])
    u0, u1 = format_uuid(uuid_bytes(0)), format_uuid(uuid_bytes(1))
    assert u0 == "GPU-5354414e-4449-4e2d-4750-552d30303030"  # "STANDIN-GPU-0000", as nvidia-smi prints it
    assert device_uuid(cu, 0) == u1 and device_uuid(cu, 1) == u0
    assert find_device(cu, u0) == 1 and find_device(cu, u1.upper().replace("GPU-", "GPU-")) == 0
    with pytest.raises(CudaError, match=r"GPU GPU-0000.* is not visible to this process \(it sees "
                                        rf"{u1}, {u0}; CUDA_VISIBLE_DEVICES="):
        find_device(cu, "GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(CudaError, match=r"GPU 2 of this process: cuDeviceGet: CUDA_ERROR_INVALID_DEVICE \(101\)"):
        device_uuid(cu, 2)
    with pytest.raises(ValueError):
        format_uuid(b"short")
    assert cu.violations == []


class _Torchish:
    cuda_stream = 0xBEEF


class _Cupyish:
    ptr = 0xCAFE


class _Numbaish:
    handle = ctypes.c_void_p(0xF00D)


class _Protocol:
    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, 0xD00D)


@pytest.mark.parametrize("stream,want", [(None, None), (0, 0), (2, 2), (0x7F00_1234, 0x7F00_1234),
                                         (_Torchish(), 0xBEEF), (_Cupyish(), 0xCAFE), (_Numbaish(), 0xF00D),
                                         (_Protocol(), 0xD00D)])
def test_stream_handle(stream: Any, want: Any) -> None:
    assert stream_handle(stream) == want


@pytest.mark.parametrize("stream,err,msg", [(True, TypeError, "cuda_stream"), ("s", TypeError, "cuda_stream must be None"),
                                            (object(), TypeError, "got object"), (-1, ValueError, r"cuda_stream.*-1"),
                                            (1 << 64, ValueError, "cuda_stream")])
def test_stream_handle_rejects(stream: Any, err: type[Exception], msg: str) -> None:
    with pytest.raises(err, match=msg):
        stream_handle(stream)


def test_fence_default_records_on_the_consumers_stream_not_the_context() -> None:
    """By default no whole-context wait: an event on the legacy default
    stream (it follows every blocking stream), or on PyTorch's current
    stream when PyTorch has initialised CUDA."""
    cu = FakeCuda()
    f = ReleaseFence(cu, 1, None, current=lambda dev: None)
    f.wait()
    f.record(3)
    assert f.done(0) == [3]
    assert "cuCtxSynchronize" not in cu.names()
    assert [s for _, s in cu.records] == [CU_STREAM_LEGACY, CU_STREAM_LEGACY]
    f.close()
    clean(cu)
    cu = FakeCuda()
    f = ReleaseFence(cu, 1, None, current=lambda dev: 0xD1 if dev == 1 else None)  # torch.cuda.current_stream(1)
    f.record(0)
    assert f.done(0) == [0] and [s for _, s in cu.records] == [0xD1] and "cuCtxSynchronize" not in cu.names()
    f.close()
    clean(cu)
    with pytest.raises(CudaError, match="closed"):
        f.wait()


def test_fence_context_synchronizes_when_asked() -> None:
    cu = FakeCuda()
    f = ReleaseFence(cu, 1, "context")
    f.record(5)
    assert f.done(0) == [5] and cu.syncs == ["ctx 1"] and not cu.events
    f.close()
    clean(cu)


def test_fence_holds_slots_back_until_their_events_complete() -> None:
    """A slot goes back once its event completed (polled, no wait); the
    host waits, oldest first, only past keep slots held back."""
    cu = FakeCuda()
    f = ReleaseFence(cu, 0, 0xBEEF)
    f.record(1)
    (ev1,) = cu.events
    cu.not_ready.add(ev1)
    assert f.done(2) == [] and f.held == [1] and cu.syncs == []
    f.record(2)
    ev2 = next(e for e in cu.events if e != ev1)
    cu.not_ready.add(ev2)
    assert f.done(2) == [] and f.held == [1, 2] and cu.syncs == []
    f.record(4)
    ev3 = next(e for e in cu.events if e not in (ev1, ev2))
    cu.not_ready.add(ev3)
    assert f.done(2) == [1] and cu.syncs == [f"event {ev1:#x}"]  # three held back, two allowed: the oldest waited for
    cu.not_ready.discard(ev3)
    assert f.done(2) == [4] and f.held == [2]  # done out of order (another stream): it goes, no wait
    cu.not_ready.clear()
    assert f.done(2) == [2] and f.held == [] and len(cu.syncs) == 1
    f.record(6)
    assert len(cu.events) == 3, "events are reused, not made per release"
    f.forget()
    assert f.held == [] and f.done(0) == []
    assert "cuCtxSynchronize" not in cu.names()
    f.close()
    clean(cu)


def test_fence_on_a_stream_records_one_blocking_event() -> None:
    cu = FakeCuda()
    f = ReleaseFence(cu, 0, 0xBEEF)
    f.wait()
    f.wait()
    creates = [a for n, a in cu.calls if n == "cuEventCreate"]
    assert len(creates) == 1 and creates[0][1] == 0x1 | 0x2  # BLOCKING_SYNC | DISABLE_TIMING: no spinning core
    (ev,) = cu.events
    assert cu.records == [(ev, 0xBEEF), (ev, 0xBEEF)] and cu.syncs == [f"event {ev:#x}"] * 2
    assert "cuCtxSynchronize" not in cu.names()
    f.close()
    assert cu.names()[-4:] == ["cuCtxPushCurrent_v2", "cuEventDestroy_v2", "cuCtxPopCurrent_v2",
                               "cuDevicePrimaryCtxRelease_v2"]
    clean(cu)


def test_fence_failure_names_the_call_and_pops() -> None:
    cu = FakeCuda(fail={"cuEventSynchronize": 999})
    f = ReleaseFence(cu, 0, 5)
    with pytest.raises(CudaError, match=r"cuEventSynchronize: CUDA_ERROR_UNKNOWN \(999\)"):
        f.wait()
    assert cu.live()["pushed"] == 0
    f.close()
    clean(cu)


def test_fence_wait_failure_loses_no_slot() -> None:
    """A wait that fails after other slots were found done raises naming
    the call; those slots and the one waited for stay held back, and go
    out next time."""
    cu = FakeCuda()
    f = ReleaseFence(cu, 0, 5)
    for slot in (1, 2, 3):
        f.record(slot)
    ev1, ev2, ev3 = [e for e, _ in cu.records]
    cu.not_ready |= {ev2, ev3}
    cu.fail["cuEventSynchronize"] = 999
    with pytest.raises(CudaError, match=r"cuEventSynchronize: CUDA_ERROR_UNKNOWN \(999\)"):
        f.done(1)  # 1 done; 2 and 3 busy, one more than keep: 2 waited for
    assert sorted(f.held) == [1, 2, 3] and cu.live()["pushed"] == 0
    del cu.fail["cuEventSynchronize"]
    assert f.done(1) == [1, 2] and f.held == [3]
    f.close()
    clean(cu)


def test_no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIB_DIR_ENV, raising=False)
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is present")
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("libcuda.so.1 loads here")
    except OSError:
        pass
    with pytest.raises(CudaError, match="no NVIDIA driver found"):
        DeviceMapping(0, 1 << 21, 0)


def test_gpu_source_without_driver_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """device="gpu" in a process without a driver: CudaError saying what
    was tried, before the daemon is asked (nothing listens here)."""
    monkeypatch.delenv(LIB_DIR_ENV, raising=False)
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is present")
    from nvfeed import LoaderSource
    with pytest.raises(CudaError, match="no NVIDIA driver found: libcuda.so.1 is not in the dynamic loader's path"):
        LoaderSource("train", socket="/nonexistent/loaderd.sock", batch_size=2, device="gpu", device_id=0)


def test_gpu_source_without_driver_is_a_loader_error_saying_what_to_do(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """A script catching LoaderError catches a machine without a driver,
    and the message says what to do (whether NVFEED_CUDA_LIB_DIR is unset
    or names a folder without the driver)."""
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is present")
    from nvfeed import LoaderError, LoaderSource
    for lib_dir in (None, str(tmp_path)):
        if lib_dir is None:
            monkeypatch.delenv(LIB_DIR_ENV, raising=False)
        else:
            monkeypatch.setenv(LIB_DIR_ENV, lib_dir)
        with pytest.raises(LoaderError, match=r"install the NVIDIA driver.*or use device='cpu'"):
            LoaderSource("train", socket="/nonexistent/loaderd.sock", batch_size=2, device="gpu", device_id=0)


@pytest.mark.parametrize("code,says", [(100, "CUDA_VISIBLE_DEVICES"), (101, "device_id"), (2, "out of memory"),
                                       (803, "reboot")])
def test_driver_errors_say_what_to_do(code: int, says: str) -> None:
    from nvfeed import LoaderError
    cu = FakeCuda(fail={"cuDeviceGet": code})
    with pytest.raises(LoaderError, match=says) as e:
        device_uuid(cu, 0)
    assert isinstance(e.value, CudaError) and e.value.call == "cuDeviceGet" and e.value.code == code


def test_libcuda_from_the_system_when_the_lib_dir_lacks_it(tmp_path: Path) -> None:
    """NVFEED_CUDA_LIB_DIR naming a folder without libcuda.so.1: the
    dynamic loader's search still finds the system's driver (here the
    stand-in, on LD_LIBRARY_PATH)."""
    import standin as standin_lib
    lib = standin_lib.build(tmp_path / "lib")
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "CUFILE_"))}
    env.update({LIB_DIR_ENV: str(empty), "LD_LIBRARY_PATH": str(lib), "PYTHONPATH": str(TESTS.parent)})
    code = ("from nvfeed._cuda import load_libcuda, device_uuid\n"
            "cu = load_libcuda()\n"
            "print(device_uuid(cu, 0))\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().startswith("GPU-"), r.stdout
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "libcuda.so.1").write_bytes(b"not a library")
    env[LIB_DIR_ENV] = str(broken)  # a file that does not load is an error, not a reason to look elsewhere
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "cannot load" in r.stderr, r.stderr[-2000:]


def test_gpu_source_without_driver_in_the_daemon_is_a_bad_request(daemon: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's own answer when it has no driver (the client's is the
    libcuda double here)."""
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is present")
    import nvfeed._session
    monkeypatch.setattr(nvfeed._session, "load_libcuda", lambda: FakeCuda())
    from nvfeed import LoaderSource
    with pytest.raises(BadRequestError, match="no CUDA driver found: .*(no usable CUDA libraries|NVIDIA driver)") as e:
        LoaderSource("train", socket=daemon.socket, batch_size=2, device="gpu", device_id=0)
    assert e.value.status == 400
    # the daemon's search path is its own: the client is told no place of it
    assert "site-packages" not in str(e.value) and "lib64" not in str(e.value), str(e.value)


def test_gpu_script_says_no_gpu_here() -> None:
    """bench/gpu.sh, the one-command check for a GPU machine, exits 0
    saying so on a machine without a driver; its client script compiles."""
    import py_compile
    repo = Path(__file__).resolve().parents[2]
    py_compile.compile(str(repo / "bench" / "gpu_check.py"), doraise=True)
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is present: bench/gpu.sh would run for real")
    r = subprocess.run(["bash", str(repo / "bench" / "gpu.sh")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "no GPU" in r.stdout, (r.returncode, r.stdout, r.stderr)
