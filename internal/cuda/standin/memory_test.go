// SPDX-License-Identifier: Apache-2.0

package standin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/internal/cuda"
)

// helpers are the functions a re-executed test binary runs (helperVar
// names one); each prints its result on stdout.
func helpers() map[string]func(a *api) error {
	return map[string]func(a *api) error{
		"import": helperImport, "devices": helperDevices, "report": helperReport,
		"cufile-env": helperCuFileEnv, "rdma-off": helperRDMAOff,
	}
}

// TestProjectBindings drives the project's own bindings (internal/cuda)
// through the stand-in: versions, devices, a Thread, host registration,
// exportable device memory, a stream copy waited on by an event; at the
// end the process holds what it held before and broke no rule.
func TestProjectBindings(t *testing.T) {
	a := loadAPI(t)
	before := a.report(t)
	rt, err := cuda.LoadRuntime(filepath.Join(a.dir, Runtime))
	if err != nil {
		t.Fatal(err)
	}
	if d, r, err := rt.Versions(); err != nil || d != 13000 || r != 13000 {
		t.Errorf("versions %d %d %v, want 13000 13000", d, r, err)
	}
	if n, err := rt.DeviceCount(); err != nil || n != 2 {
		t.Errorf("devices %d %v, want 2", n, err)
	}
	if id, err := rt.PCIBusID(1); err != nil || id != "0000:11:00.0" {
		t.Errorf("PCI bus id of device 1: %q %v", id, err)
	}
	th, err := rt.NewThread(1)
	if err != nil {
		t.Fatal(err)
	}
	defer th.Close()
	host := hostMem(t, 3<<20)
	want := pattern(3<<20, 1)
	copy(host, want)
	err = th.Do(func() error {
		if err := rt.HostRegister(host); err != nil {
			return err
		}
		drv, err := rt.Driver()
		if err != nil {
			return err
		}
		m, err := drv.Alloc(1, 3<<20)
		if err != nil {
			return err
		}
		if m.Size != 4<<20 {
			t.Errorf("3 MiB allocated as %d bytes, want the 2 MiB granularity's 4 MiB", m.Size)
		}
		s, err := rt.NewStream()
		if err != nil {
			return err
		}
		e, err := rt.NewEvent()
		if err != nil {
			return err
		}
		if err := rt.CopyToDevice(m.Ptr, host, s); err != nil {
			return err
		}
		if err := rt.Record(e, s); err != nil {
			return err
		}
		if err := rt.Wait(e); err != nil {
			return err
		}
		if !bytes.Equal(bytesAt(m.Ptr, 3<<20), want) {
			t.Errorf("the device memory does not hold the bytes copied")
		}
		f, err := m.Export()
		if err != nil {
			return err
		}
		if mid := a.report(t).Live["handles"]; mid != before.Live["handles"]+1 {
			t.Errorf("an exported descriptor open: handles %d, want %d", mid, before.Live["handles"]+1)
		}
		f.Close()
		return firstError(m.Free(), rt.DestroyEvent(e), rt.DestroyStream(s), rt.HostUnregister(host))
	})
	if err != nil {
		t.Fatal(err)
	}
	after := a.report(t)
	a.wantViolation(t, before, "")
	if !maps.Equal(after.Live, before.Live) {
		t.Errorf("live counts %v after a clean teardown, want %v", after.Live, before.Live)
	}
	if after.RuntimeContexts < 1 || after.Copies <= before.Copies {
		t.Errorf("runtime contexts %d, copies %d (before %d): cudaSetDevice and the copy not counted",
			after.RuntimeContexts, after.Copies, before.Copies)
	}
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// TestExportImportAcrossProcesses exports device memory of GPU 1 to a
// second process that sees the GPUs in the other order
// (CUDA_VISIBLE_DEVICES=1,0): it finds the GPU by UUID, imports, maps and
// reads the exporter's bytes, and writes bytes the exporter then sees.
func TestExportImportAcrossProcesses(t *testing.T) {
	a := loadAPI(t)
	defer a.onDevice(t, 1)()
	m := a.alloc(t, 1, 2*gran, false)
	defer a.free(t, m)
	want := pattern(int(m.size), 3)
	copy(bytesAt(m.ptr, m.size), want)
	var fd int32
	must(t, "cuMemExportToShareableHandle", a.cuMemExport(&fd, m.h, 1, 0))
	f := os.NewFile(uintptr(fd), "exported")
	defer f.Close()
	out, reports := helper(t, "import", []*os.File{f}, VisibleVar+"=1,0", "STANDIN_TEST_SIZE="+strconv.Itoa(int(m.size)))
	var got struct {
		Ordinal int
		Sum     string
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	sum := sha256.Sum256(want)
	if got.Ordinal != 0 || got.Sum != hex.EncodeToString(sum[:]) {
		t.Errorf("importer: GPU 1 at its ordinal %d, bytes %s; want ordinal 0, bytes %x", got.Ordinal, got.Sum, sum)
	}
	if w := bytesAt(m.ptr, 8); string(w) != "imported" {
		t.Errorf("the importer's write is not seen by the exporter: %q", w)
	}
	CheckClean(t, reports)
}

// helperImport imports the descriptor 3 of STANDIN_TEST_SIZE bytes of
// physical GPU 1's memory, on whichever ordinal has that UUID.
func helperImport(a *api) error {
	size, _ := strconv.Atoi(os.Getenv("STANDIN_TEST_SIZE"))
	if err := check("cuInit", a.cuInit(0)); err != nil {
		return err
	}
	ordinal := -1
	var n int32
	a.cuDeviceGetCount(&n)
	for i := range n {
		var u [16]byte
		if a.cuDeviceGetUuid(&u, i) == 0 && u == uuidOf(1) {
			ordinal = int(i)
		}
	}
	var ctx, ptr, old uintptr
	var h uint64
	access := cuda.MemAccessDesc{Location: cuda.MemLocation{Type: 1, ID: int32(ordinal)}, Flags: 3}
	for _, c := range []struct {
		call string
		fn   func() int32
	}{
		{"cuDevicePrimaryCtxRetain", func() int32 { return a.cuPrimaryCtxRetain(&ctx, int32(ordinal)) }},
		{"cuCtxPushCurrent", func() int32 { return a.cuCtxPushCurrent(ctx) }},
		{"cuMemImportFromShareableHandle", func() int32 { return a.cuMemImport(&h, 3, 1) }},
		{"cuMemAddressReserve", func() int32 { return a.cuMemAddressReserve(&ptr, uintptr(size), 0, 0, 0) }},
		{"cuMemMap", func() int32 { return a.cuMemMap(ptr, uintptr(size), 0, h, 0) }},
		{"cuMemRelease", func() int32 { return a.cuMemRelease(h) }},
		{"cuMemSetAccess", func() int32 { return a.cuMemSetAccess(ptr, uintptr(size), &access, 1) }},
		{"read and write", func() int32 {
			sum := sha256.Sum256(bytesAt(ptr, uintptr(size)))
			copy(bytesAt(ptr, 8), "imported")
			fmt.Printf(`{"ordinal":%d,"sum":"%x"}`, ordinal, sum)
			return 0
		}},
		{"cuMemUnmap", func() int32 { return a.cuMemUnmap(ptr, uintptr(size)) }},
		{"cuMemAddressFree", func() int32 { return a.cuMemAddressFree(ptr, uintptr(size)) }},
		{"cuCtxPopCurrent", func() int32 { return a.cuCtxPopCurrent(&old) }},
		{"cuDevicePrimaryCtxRelease", func() int32 { return a.cuPrimaryCtxRelease(int32(ordinal)) }},
	} {
		if err := check(c.call, c.fn()); err != nil {
			return err
		}
	}
	return nil
}

// TestVisibleDevices: CUDA_VISIBLE_DEVICES orders and hides GPUs as CUDA
// does (indices or UUID prefixes, the list ending at the first entry that
// names no GPU or one already listed); UUIDs and PCI bus ids follow the
// physical GPU.
func TestVisibleDevices(t *testing.T) {
	uuid1 := "GPU-5354414e-4449-4e2d-4750-552d30303031"
	for _, c := range []struct {
		env  []string
		init int32
		gpus []int // physical, by ordinal
	}{
		{nil, 0, []int{0, 1}},
		{[]string{VisibleVar + "=1,0"}, 0, []int{1, 0}},
		{[]string{VisibleVar + "=" + uuid1}, 0, []int{1}},
		{[]string{VisibleVar + "=1," + uuid1[:20]}, 0, []int{1}}, // a prefix naming both GPUs names none
		{[]string{VisibleVar + "=0,7,1"}, 0, []int{0}},
		{[]string{VisibleVar + "=1,1,0"}, 0, []int{1}},
		{[]string{VisibleVar + "=", GPUsVar + "=2"}, 100, nil},
		{[]string{GPUsVar + "=4", VisibleVar + "=3,GPU-5354414e-4449-4e2d-4750-552d30303032"}, 0, []int{3, 2}},
		{[]string{GPUsVar + "=0"}, 100, nil},
	} {
		t.Run(fmt.Sprint(c.env), func(t *testing.T) {
			out, reports := helper(t, "devices", nil, c.env...)
			var got struct {
				Init int32
				GPUs []int
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("helper output %q: %v", out, err)
			}
			if got.Init != c.init || !slices.Equal(got.GPUs, c.gpus) {
				t.Errorf("cuInit %d, GPUs %v; want %d, %v", got.Init, got.GPUs, c.init, c.gpus)
			}
			if c.init == 0 {
				CheckClean(t, reports)
			}
		})
	}
}

// helperDevices prints cuInit's result and each ordinal's physical GPU
// (from its UUID), checking its PCI bus id on the way.
func helperDevices(a *api) error {
	out := struct {
		Init int32 `json:"init"`
		GPUs []int `json:"gpus"`
	}{Init: a.cuInit(0)}
	var n int32
	if out.Init == 0 {
		if err := check("cuDeviceGetCount", a.cuDeviceGetCount(&n)); err != nil {
			return err
		}
	}
	for i := range n {
		var u [16]byte
		bus := make([]byte, 16)
		if err := check("cuDeviceGetUuid", a.cuDeviceGetUuid(&u, i)); err != nil {
			return err
		}
		phys, err := strconv.ParseInt(string(u[15:]), 16, 32)
		if err != nil || u != uuidOf(int(phys)) {
			return fmt.Errorf("ordinal %d: UUID %q", i, u)
		}
		if err := check("cuDeviceGetPCIBusId", a.cuDeviceGetPCIBusId(&bus[0], 16, i)); err != nil {
			return err
		}
		if want := fmt.Sprintf("0000:%02x:00.0", 0x10+phys); string(bus[:12]) != want {
			return fmt.Errorf("ordinal %d: PCI bus id %q, want %q", i, bus, want)
		}
		out.GPUs = append(out.GPUs, int(phys))
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// TestStreamsEventsAndKernels: a stand-in kernel (cuStandinLaunchRead)
// runs after its delay on its stream, an event recorded after it is not
// ready until then, a second stream waiting on the event runs after it;
// and the kernel reads the device memory as it is when it runs, so a slot
// rewritten before the consumer's work finished is seen.
func TestStreamsEventsAndKernels(t *testing.T) {
	a := loadAPI(t)
	before := a.report(t)
	defer a.onDevice(t, 0)()
	m := a.alloc(t, 0, gran, false)
	defer a.free(t, m)
	old, now := pattern(4096, 1), pattern(4096, 2)
	copy(bytesAt(m.ptr, 4096), old)
	host := hostMem(t, 2*4096)
	var s1, s2, e1, e2 uintptr
	must(t, "cuStreamCreate", a.cuStreamCreate(&s1, 1))
	must(t, "cuStreamCreate", a.cuStreamCreate(&s2, 1))
	must(t, "cuEventCreate", a.cuEventCreate(&e1, 3))
	must(t, "cuEventCreate", a.cuEventCreate(&e2, 3))
	must(t, "cuStandinLaunchRead", a.cuStandinLaunchRead(s1, m.ptr, 4096, 100_000, addr(host)))
	must(t, "cuEventRecord", a.cuEventRecord(e1, s1))
	must(t, "cuStreamWaitEvent", a.cuStreamWaitEvent(s2, e1, 0))
	must(t, "cuStandinLaunchRead", a.cuStandinLaunchRead(s2, m.ptr, 4096, 0, addr(host)+4096))
	must(t, "cuEventRecord", a.cuEventRecord(e2, s2))
	if got := a.cuEventQuery(e1); got != 600 {
		t.Errorf("cuEventQuery of an event behind a 100 ms kernel: %d, want 600 (not ready)", got)
	}
	start := time.Now()
	must(t, "cuMemcpyHtoD", a.cuMemcpyHtoD(m.ptr, addr(now), 4096)) // the producer rewrites the slot
	must(t, "cuEventSynchronize", a.cuEventSynchronize(e2))
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("the second stream's kernel finished %v after the first was launched: it did not wait", d)
	}
	if !bytes.Equal(host[:4096], now) || !bytes.Equal(host[4096:], now) {
		t.Errorf("the kernels did not read the slot as it was when they ran")
	}
	must(t, "cuEventQuery", a.cuEventQuery(e1))
	for _, e := range []uintptr{e1, e2} {
		must(t, "cuEventDestroy", a.cuEventDestroy(e))
	}
	for _, s := range []uintptr{s1, s2} {
		must(t, "cuStreamDestroy", a.cuStreamDestroy(s))
	}
	a.wantViolation(t, before, "")
}

// TestSpinningEvents counts events waited on without BlockingSync (the
// real driver spins a core for them), once per event.
func TestSpinningEvents(t *testing.T) {
	a := loadAPI(t)
	defer a.onDevice(t, 0)()
	for _, c := range []struct {
		flags uint32
		spins int64
	}{{0, 1}, {2, 1}, {1, 0}, {3, 0}} {
		before := a.report(t).SpinningEvents
		var e uintptr
		must(t, "cuEventCreate", a.cuEventCreate(&e, c.flags))
		must(t, "cuEventRecord", a.cuEventRecord(e, 0))
		must(t, "cuEventSynchronize", a.cuEventSynchronize(e))
		must(t, "cuEventSynchronize", a.cuEventSynchronize(e))
		must(t, "cuEventDestroy", a.cuEventDestroy(e))
		if got := a.report(t).SpinningEvents - before; got != c.spins {
			t.Errorf("event flags %#x: %d spinning, want %d", c.flags, got, c.spins)
		}
	}
}

// TestMemcpy2DPacks: cudaMemcpy2DAsync packs rows of a pitched host
// buffer back to back on the device (the dense batch layout).
func TestMemcpy2DPacks(t *testing.T) {
	a := loadAPI(t)
	before := a.report(t)
	done := a.onDevice(t, 1)
	defer done()
	must(t, "cudaSetDevice", a.cudaSetDevice(1))
	m := a.alloc(t, 1, gran, false)
	defer a.free(t, m)
	const rows, width, pitch = 3, 1000, 4096
	host := hostMem(t, rows*pitch)
	var want []byte
	for i := range rows {
		row := pattern(width, byte(i+1))
		copy(host[i*pitch:], row)
		want = append(want, row...)
	}
	var s uintptr
	must(t, "cudaStreamCreateWithFlags", a.cudaStreamCreate(&s, 1))
	must(t, "cudaMemcpy2DAsync", a.cudaMemcpy2DAsync(m.ptr, width, addr(host), pitch, width, rows, 1, s))
	must(t, "cuStreamSynchronize", a.cuStreamSynchronize(s))
	must(t, "cudaStreamDestroy", a.cudaStreamDestroy(s))
	if !bytes.Equal(bytesAt(m.ptr, rows*width), want) {
		t.Errorf("the rows are not packed back to back on the device")
	}
	a.wantViolation(t, before, "")
}
