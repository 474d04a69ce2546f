# SPDX-License-Identifier: Apache-2.0
"""The GPU client without a GPU: the CUDA array objects field by field,
and the import of a VMM descriptor against a recording stand-in for
libcuda (the real one runs on a GPU machine: bench/gpu.sh)."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import pytest

from nvfeed import BadRequestError, CudaArray
from nvfeed._cuda import CudaError, DeviceMapping


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
    assert len(a) == 12345 and a.shape == (12345,) and a.device == 3


class FakeCuda:
    """Records driver calls; out-parameters get fixed values; one call may
    fail."""

    def __init__(self, fail: str = "") -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail = fail

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> int:
            self.calls.append((name, args))
            if name == self.fail:
                return 2  # CUDA_ERROR_OUT_OF_MEMORY
            if name == "cuMemAddressReserve":
                args[0]._obj.value = 0x7000_0000
            if name == "cuMemImportFromShareableHandle":
                args[0]._obj.value = 42
            if name == "cuGetErrorName":
                args[1]._obj.value = b"CUDA_ERROR_OUT_OF_MEMORY"
            return 0
        return call

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]


def test_import_sequence() -> None:
    cu = FakeCuda()
    m = DeviceMapping(17, 1 << 21, 1, lib=cu)  # type: ignore[arg-type]
    assert m.ptr == 0x7000_0000 and m.size == 1 << 21 and m.device == 1
    assert cu.names() == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent_v2",
                          "cuMemImportFromShareableHandle", "cuMemAddressReserve", "cuMemMap", "cuMemRelease",
                          "cuMemSetAccess", "cuCtxPopCurrent_v2"]
    args = dict(cu.calls)
    assert args["cuMemImportFromShareableHandle"][1].value == 17  # the descriptor, passed as the pointer
    assert args["cuMemImportFromShareableHandle"][2] == 1  # POSIX file descriptor
    desc = args["cuMemSetAccess"][2]._obj
    assert (desc.location.type, desc.location.id, desc.flags) == (1, 1, 3)  # device 1, read-write
    assert args["cuMemMap"][1].value == 1 << 21
    m.close()
    assert cu.names()[-3:] == ["cuMemUnmap", "cuMemAddressFree", "cuDevicePrimaryCtxRelease_v2"]
    m.close()  # twice is a no-op
    assert cu.names().count("cuMemUnmap") == 1


def test_import_failure_names_the_call_and_cleans_up() -> None:
    cu = FakeCuda(fail="cuMemMap")
    with pytest.raises(CudaError, match=r"cuMemMap: CUDA_ERROR_OUT_OF_MEMORY \(2\)"):
        DeviceMapping(17, 1 << 21, 0, lib=cu)  # type: ignore[arg-type]
    names = cu.names()
    assert "cuMemRelease" in names and names[-1] == "cuCtxPopCurrent_v2", names  # the handle released, the context popped
    assert "cuMemSetAccess" not in names and "cuMemUnmap" not in names
    assert "cuMemAddressFree" in names and "cuDevicePrimaryCtxRelease_v2" in names  # the reservation and context given back


def test_no_driver() -> None:
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is present")
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("libcuda.so.1 loads here")
    except OSError:
        pass
    with pytest.raises(CudaError, match="no NVIDIA driver found"):
        DeviceMapping(0, 1 << 21, 0)


def test_gpu_source_without_driver_is_a_bad_request(daemon: Any) -> None:
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is present")
    from nvfeed import LoaderSource
    with pytest.raises(BadRequestError, match="no NVIDIA driver found") as e:
        LoaderSource("train", socket=daemon.socket, batch_size=2, device="gpu", device_id=0)
    assert e.value.status == 400


def test_gpu_script_says_no_gpu_here() -> None:
    """bench/gpu.sh, the one-command check for a GPU machine, exits 0
    saying so on a machine without a driver; its client script compiles."""
    import py_compile
    import subprocess
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    py_compile.compile(str(repo / "bench" / "gpu_check.py"), doraise=True)
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is present: bench/gpu.sh would run for real")
    r = subprocess.run(["bash", str(repo / "bench" / "gpu.sh")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "no GPU" in r.stdout, (r.returncode, r.stdout, r.stderr)
