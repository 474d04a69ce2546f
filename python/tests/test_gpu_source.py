# SPDX-License-Identifier: Apache-2.0
"""LoaderSource with device="gpu" against a daemon double and the strict
libcuda double (no daemon, no GPU): the GPU named by UUID, the consumer's
work waited for before a slot goes back, no mapping leaked by a
reconnect, a close or the end of the process, and dense batches for
DALI."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

from fakecuda import FakeCuda, _v, uuid_bytes
from fakedaemon import SLOT, FakeDaemon
from nvfeed import CudaArray, LoaderError, LoaderSource
from nvfeed._cuda import CU_STREAM_LEGACY, CudaError, format_uuid

TESTS = Path(__file__).resolve().parent
U0, U1 = format_uuid(uuid_bytes(0)), format_uuid(uuid_bytes(1))


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeDaemon, FakeCuda]]:
    """The daemon numbers GPUs 0,1; this process sees them as 1,0
    (CUDA_VISIBLE_DEVICES=1,0): ordinals differ, UUIDs do not."""
    d, cu = FakeDaemon(), FakeCuda(gpus=[uuid_bytes(1), uuid_bytes(0)])
    d.install(monkeypatch, cu)
    yield d, cu
    d.close_fds()


def _source(d: FakeDaemon, **kw: Any) -> LoaderSource:
    args: dict[str, Any] = dict(socket="/nonexistent/loaderd.sock", batch_size=d.batch_size, transport="http",
                                device="gpu", device_id=0, zero_copy=True)
    args.update(kw)
    return LoaderSource("train", **args)


def _clean(cu: FakeCuda) -> None:
    assert cu.violations == []
    assert cu.live() == {"primary_ctx_retains": 0, "imports": 0, "reservations": 0, "mappings": 0, "events": 0,
                         "pushed": 0}


def test_gpu_named_by_uuid(env: tuple[FakeDaemon, FakeCuda]) -> None:
    """device_id 0 here is the daemon's GPU 1: the open names it by UUID,
    and the memory is mapped on this process's ordinal of the UUID the
    daemon's description gives (0), not on the daemon's ordinal (1)."""
    d, cu = env
    with _source(d) as src:
        req = d.requests[0][2]
        assert req["device_uuid"] == U1 and req["device_id"] == 0
        assert src.memory["device"] == 1 and src.memory["uuid"] == U1
        access = [a for n, a in cu.calls if n == "cuMemSetAccess"]
        assert [a[2]._obj.location.id for a in access] == [0]
        samples, _ = next(src)
        assert isinstance(samples, CudaArray) and samples.shape == (3, 1000) and samples.device == 0
    del samples
    _clean(cu)


def test_gpu_batches_outside_dali_need_zero_copy(env: tuple[FakeDaemon, FakeCuda]) -> None:
    """Read by user code, GPU batches are views the client cannot copy:
    without zero_copy=True next() raises ValueError saying so, before a
    batch is asked for."""
    d, cu = env
    with _source(d, zero_copy=False) as src:
        with pytest.raises(ValueError, match="zero_copy=True"):
            next(src)
        assert not d.requests[1:], "a batch was asked for"
    _clean(cu)


def test_memory_on_a_gpu_this_process_cannot_see(env: tuple[FakeDaemon, FakeCuda]) -> None:
    d, cu = env
    d.gpu_order = (0, 1, 2)  # the daemon's GPU 2 is not visible here
    real_open = d._open

    def elsewhere(req: dict[str, Any]) -> dict[str, Any]:
        r = real_open(req)
        d.device = 2
        r["memory"] = d.desc()
        return r
    d._open = elsewhere  # type: ignore[method-assign]
    u2 = format_uuid(uuid_bytes(2))
    with pytest.raises(LoaderError, match=rf"cannot map its gpu batch memory: GPU {u2} is not visible to this "
                                          rf"process \(it sees {U1}, {U0}"):
        _source(d)
    _clean(cu)


def test_memory_on_another_gpu_than_asked(env: tuple[FakeDaemon, FakeCuda]) -> None:
    d, cu = env
    real_open = d._open

    def ordinal(req: dict[str, Any]) -> dict[str, Any]:  # a daemon that took device_id as its own ordinal
        r = real_open(req)
        d.device = req["device_id"]
        r["memory"] = d.desc()
        return r
    d._open = ordinal  # type: ignore[method-assign]
    with pytest.raises(LoaderError, match=rf"placed session s1's memory on GPU {U0} \(device 1 here\), not on {U1} "
                                          r"\(device_id 0\)"):
        _source(d)
    _clean(cu)


def _releases(d: FakeDaemon) -> list[int]:
    """Indices in the log of next requests that gave GPU slots back."""
    return [i for i, e in enumerate(d.log) if e.startswith("next release=") and e != "next release=[]"]


class _Device(set[int]):
    """FakeCuda.not_ready while ``busy``: every event not done yet."""

    busy = True

    def __contains__(self, ev: object) -> bool:
        return self.busy


def _name_events(d: FakeDaemon, cu: FakeCuda, device: _Device) -> None:
    """d.log names the event of each event call ("cuEventQuery 0x..."),
    and says what a query finds ("busy", "done")."""
    def on_call(name: str) -> None:
        if name in ("cuEventRecord", "cuEventSynchronize", "cuEventQuery"):
            name += f" {_v(cu.calls[-1][1][0]):#x}"
            if name.startswith("cuEventQuery"):
                name += " busy" if device.busy else " done"
        d.log.append(name)
    cu.on_call = on_call


def test_release_waits_for_the_device(env: tuple[FakeDaemon, FakeCuda]) -> None:
    """Default (no cuda_stream, no PyTorch): no slot goes back before the
    device finished the work queued on it. An event is recorded on the
    legacy default stream after the batch after the slot's was handed
    out; the slot goes back only once cuEventQuery found that event done,
    or, while the device is busy and more than prefetch_queue_depth slots
    are held back, once cuEventSynchronize waited for it (the oldest
    first); the context pushed and popped around each; no whole-context
    cuCtxSynchronize."""
    d, cu = env
    d.batches = d.slots = 8  # batch b in slot b
    device = _Device()
    cu.not_ready = device
    _name_events(d, cu, device)
    with _source(d, release_after=1) as src:
        assert src.prefetch_queue_depth == 2
        got = []
        for b, (s, _) in enumerate(src):
            got.append(s)
            if b == 5:
                device.busy = False  # the device catches up with all queued so far
        assert len(got) == 8
    rel = _releases(d)
    assert [d.log[i] for i in rel] == ["next release=[0]", "next release=[1]", "next release=[2, 3, 4]",
                                       "next release=[5]", "next release=[6]"]
    nexts = [i for i, e in enumerate(d.log) if e.startswith("next release=")]
    recs = [i for i, e in enumerate(d.log) if e.startswith("cuEventRecord")]
    assert len(recs) == 7 and [st for _, st in cu.records] == [CU_STREAM_LEGACY] * 7
    for slot, r in enumerate(recs):
        assert nexts[slot + 1] < r < nexts[slot + 2]  # after batch slot + 1 was handed out
    for i in rel:
        for slot in map(int, d.log[i].split("=")[1].strip("[]").split(", ")):
            ev = d.log[recs[slot]].split()[1]
            waits = [e for e in d.log[recs[slot]:i] if e.split()[1:2] == [ev] and not e.startswith("cuEventRecord")]
            assert waits and waits[-1] in (f"cuEventSynchronize {ev}", f"cuEventQuery {ev} done"), (slot, waits)
            assert f"cuEventQuery {ev} done" in waits or slot in (0, 1)  # waited for only while busy
    assert [e.split()[0] for e in d.log if e.startswith("cuEventSynchronize")] == ["cuEventSynchronize"] * 2
    assert "cuCtxSynchronize" not in d.log
    assert cu.violations == [] and cu.live()["pushed"] == 0
    del got, s  # the last arrays: the mapping goes, after the device's work
    gc.collect()
    assert d.log[-6:] == ["cuCtxPushCurrent_v2", "cuCtxSynchronize", "cuMemUnmap", "cuMemAddressFree",
                          "cuCtxPopCurrent_v2", "cuDevicePrimaryCtxRelease_v2"]
    _clean(cu)


def test_release_waits_for_the_consumers_stream(env: tuple[FakeDaemon, FakeCuda]) -> None:
    """With cuda_stream: one event (blocking sync, no timing), recorded on
    the consumer's stream and found done (cuEventQuery, no wait) before
    every release, reused; destroyed at close."""
    d, cu = env

    class Stream:
        cuda_stream = 0xBEEF  # as torch.cuda.Stream gives it

    with _source(d, release_after=0, cuda_stream=Stream()) as src:
        assert sum(1 for _ in src) == 4
        assert cu.syncs == []  # all done: the host never waited
    rel = _releases(d)
    assert len(rel) == 4  # after batches 0, 1, 2, and 3 (at the end of the epoch)
    for i in rel:
        before = [c for c in d.log[i - 7:i] if c != "cuEventCreate"]  # the first time only
        assert before[-6:] == ["cuCtxPushCurrent_v2", "cuEventRecord", "cuCtxPopCurrent_v2",
                               "cuCtxPushCurrent_v2", "cuEventQuery", "cuCtxPopCurrent_v2"], before
    creates = [a for n, a in cu.calls if n == "cuEventCreate"]
    assert len(creates) == 1 and creates[0][1] == 0x1 | 0x2  # BLOCKING_SYNC | DISABLE_TIMING
    assert d.log.count("cuEventDestroy_v2") == 1
    assert {s for _, s in cu.records} == {0xBEEF} and len(cu.records) == 4
    _clean(cu)


@pytest.mark.parametrize("fail,stream,busy", [("cuEventRecord", None, False), ("cuEventQuery", None, False),
                                              ("cuEventSynchronize", None, True),
                                              ("cuCtxSynchronize", "context", False)])
def test_release_fence_failure_keeps_the_slot(env: tuple[FakeDaemon, FakeCuda], fail: str, stream: Any,
                                              busy: bool) -> None:
    """A fence call that fails (recording the slot's event, querying it,
    waiting for it; with cuda_stream="context" the whole-context wait)
    raises naming the call; the slot is not given back (its consumer may
    still read it) and the next call tries again."""
    d, cu = env
    device = _Device()
    device.busy = busy
    cu.not_ready = device
    held = 3 if busy else 1  # busy: the host waits only past prefetch_queue_depth (2) held back
    with _source(d, release_after=0, cuda_stream=stream) as src:
        for _ in range(held):
            next(src)
        assert d.released == []
        cu.fail[fail] = 999
        with pytest.raises(CudaError, match=rf"{fail}: CUDA_ERROR_UNKNOWN \(999\)"):
            next(src)
        assert d.released == []
        del cu.fail[fail]
        device.busy = False
        next(src)
        assert d.released == list(range(held))
    gc.collect()
    _clean(cu)


@pytest.mark.parametrize("stream,err,msg", [
    (7, ValueError, r"cuda_stream is for device='gpu'.*device='cpu'"),
    ("default", TypeError, r"cuda_stream must be None, 'context', an int CUstream handle"),
    (-3, ValueError, r"cuda_stream must be a CUstream handle"),
])
def test_cuda_stream_checked_where_it_enters(env: tuple[FakeDaemon, FakeCuda], stream: Any, err: type[Exception],
                                             msg: str) -> None:
    d, cu = env
    with pytest.raises(err, match=msg):
        _source(d, cuda_stream=stream, device="cpu" if isinstance(stream, int) and stream > 0 else "gpu")
    assert d.requests == []  # before the daemon is asked
    _clean(cu)


@pytest.mark.parametrize("hold", [True, False])
def test_reconnect_does_not_leak_the_old_mapping(env: tuple[FakeDaemon, FakeCuda], hold: bool) -> None:
    """A reconnect replaces the mapping: the old one is unmapped at once
    when no array of it lives, else when the last one dies; arrays of it
    stay readable until then."""
    d, cu = env
    d.gone_at = 3
    with _source(d, reconnect_timeout=5) as src:
        held = [next(src)[0], next(src)[0]]  # dense batches: one CudaArray each
        old = held[0]._owner
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "went away; reconnecting"
            held.append(next(src)[0])
        assert d.sessions == 2 and src._session.gpu is not old
        if hold:
            assert not old.closed and len(cu.mappings) == 2  # batches 0 and 1 still readable
            assert all(old.ptr <= a.ptr and a.ptr + len(a) * a.shape[1] <= old.ptr + old.size for a in held[:2])
            del held[:2]
            gc.collect()
        else:
            del held[:2]
            gc.collect()
        assert old.closed and len(cu.mappings) == 1
        assert cu.violations == []
    del held, old
    gc.collect()
    _clean(cu)


def test_close_leaves_arrays_readable(env: tuple[FakeDaemon, FakeCuda]) -> None:
    d, cu = env
    src = _source(d)
    samples, _ = next(src)
    src.close()
    assert len(cu.mappings) == 1 and cu.live()["primary_ctx_retains"] == 1  # the mapping's own
    del samples
    gc.collect()
    _clean(cu)


EXIT_SCRIPT = """
import atexit  # first: atexit runs this hook last, after weakref.finalize's
atexit.register(lambda: print("live", cu.live(), cu.violations, flush=True))
import sys, warnings
sys.path[:0] = [{tests!r}, {python!r}]
import pytest
from fakecuda import FakeCuda, uuid_bytes
from fakedaemon import FakeDaemon
from nvfeed import LoaderSource
warnings.simplefilter("ignore")
mp = pytest.MonkeyPatch()
d, cu = FakeDaemon(gone_at=2), FakeCuda()
d.install(mp, cu)
src = LoaderSource("train", socket="/x", batch_size=3, transport="http", device="gpu", reconnect_timeout=5,
                   zero_copy=True)
held = [next(src)[0], next(src)[0]]  # one array of the first session's mapping, one of the second's
{close}
print("exit", cu.live(), flush=True)
cu.on_call = lambda name: print("call", name, flush=True)
"""


@pytest.mark.parametrize("close", ["src.close()", "pass"])
def test_end_of_process_with_arrays_held(close: str) -> None:
    """A process that ends holding arrays (of two mappings: a reconnect
    happened), its source closed or not: every mapping unmapped once, with
    its context pushed; the fence's context released; nothing left."""
    script = EXIT_SCRIPT.format(tests=str(TESTS), python=str(TESTS.parent), close=textwrap.dedent(close))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Exception ignored" not in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    assert "'mappings': 2" in lines[0]
    calls = [l.split()[1] for l in lines if l.startswith("call")]
    assert calls.count("cuMemUnmap") == 2 and calls.count("cuMemAddressFree") == 2
    for i, c in enumerate(calls):
        if c == "cuMemUnmap":
            assert calls[i - 2:i] == ["cuCtxPushCurrent_v2", "cuCtxSynchronize"], calls
    assert calls.count("cuDevicePrimaryCtxRetain") == 0
    assert calls.count("cuDevicePrimaryCtxRelease_v2") == (2 if close == "src.close()" else 3)
    live = [l for l in lines if l.startswith("live")]
    assert live == ["live {'primary_ctx_retains': 0, 'imports': 0, 'reservations': 0, 'mappings': 0, 'events': 0, "
                    "'pushed': 0} []"], lines


@pytest.mark.parametrize("dense", [True, False])
def test_dali_format_dense_batch(monkeypatch: pytest.MonkeyPatch, dense: bool) -> None:
    """batch_format="dali" on the GPU: one CudaArray (batch, size) where the
    daemon packed the samples back to back; a list where it did not; the
    labels a TensorListCPU."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali.backend import TensorListCPU
    d, cu = FakeDaemon(dense=dense), FakeCuda()
    d.install(monkeypatch, cu)
    with _source(d, batch_format="dali") as src:
        base = src._session.gpu.ptr if src._session.gpu else 0
        for b, (samples, labels) in enumerate(src):
            assert isinstance(labels, TensorListCPU)
            assert [int(x) for x in labels.as_array().reshape(-1)] == [d._label(b, i) for i in range(3)]
            offsets, lengths = d._layout(b)
            if dense:
                assert isinstance(samples, CudaArray)
                assert samples.shape == (3, 1000) and samples.ptr == base + b * SLOT
                assert samples.__cuda_array_interface__["strides"] is None
            else:
                assert isinstance(samples, list) and [s.shape for s in samples] == [(n,) for n in lengths]
                assert [s.ptr for s in samples] == [base + o for o in offsets]
        del samples, labels
    d.close_fds()
    gc.collect()
    _clean(cu)


def test_dali_format_skipped_sample_is_not_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    """on_error="skip": a batch missing its middle sample has a gap: a list."""
    pytest.importorskip("nvidia.dali")
    d, cu = FakeDaemon(failed=[1]), FakeCuda()
    d.install(monkeypatch, cu)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _source(d, batch_format="dali", on_error="skip") as src:
            samples, labels = next(src)
            assert isinstance(samples, list) and len(samples) == 2 and len(labels) == 2
            d.failed = [2]  # the last one: the rest still lie back to back
            samples, labels = next(src)
            assert isinstance(samples, CudaArray) and samples.shape == (2, 1000)
            del samples
    d.close_fds()
    gc.collect()
    _clean(cu)


def test_source_dropped_without_close(env: tuple[FakeDaemon, FakeCuda]) -> None:
    """A source nobody closed holds no reference cycle: dropping it gives
    its GPU memory and its fence's context back at once (no collection
    needed)."""
    d, cu = env
    src = _source(d)
    src.samples(), src.labels()  # the halves' state included
    gc.disable()
    try:
        del src
        _clean(cu)
    finally:
        gc.enable()
