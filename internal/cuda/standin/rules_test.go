// SPDX-License-Identifier: Apache-2.0

package standin

import (
	"runtime"
	"runtime/debug"
	"syscall"
	"testing"

	"github.com/nvfeed/nvfeed/internal/cuda"
)

// created returns a new allocation handle of size bytes on ordinal.
func (a *api) created(t *testing.T, ordinal int, size uintptr, types int32) uint64 {
	t.Helper()
	var h uint64
	p := prop(ordinal, types, false)
	must(t, "cuMemCreate", a.cuMemCreate(&h, size, &p, 0))
	return h
}

// reserved returns a new reservation of size bytes.
func (a *api) reserved(t *testing.T, size uintptr) uintptr {
	t.Helper()
	var p uintptr
	must(t, "cuMemAddressReserve", a.cuMemAddressReserve(&p, size, 0, 0, 0))
	return p
}

// TestRules breaks each precondition the stand-in enforces, once, and
// checks the error code returned and the one violation recorded. Each case
// runs on a thread of its own (contexts are per thread).
func TestRules(t *testing.T) {
	a := loadAPI(t)
	must(t, "cuInit", a.cuInit(0))
	desc := func(ordinal int32) *cuda.MemAccessDesc {
		return &cuda.MemAccessDesc{Location: cuda.MemLocation{Type: 1, ID: ordinal}, Flags: 3}
	}
	for _, c := range []struct {
		name, violation string
		code            int32
		run             func(t *testing.T) int32
	}{
		{"no current context", "cuMemCreate: no current context", 201, func(t *testing.T) int32 {
			var h uint64
			p := prop(0, 1, false)
			return a.cuMemCreate(&h, gran, &p, 0)
		}},
		{"a released context", "no longer retained", 201, func(t *testing.T) int32 {
			var ctx, p uintptr
			must(t, "cuDevicePrimaryCtxRetain", a.cuPrimaryCtxRetain(&ctx, 0))
			must(t, "cuCtxPushCurrent", a.cuCtxPushCurrent(ctx))
			must(t, "cuDevicePrimaryCtxRelease", a.cuPrimaryCtxRelease(0))
			defer a.cuCtxPopCurrent(&ctx)
			return a.cuMemAddressReserve(&p, gran, 0, 0, 0)
		}},
		{"release of a primary context not retained", "not retained", 201, func(t *testing.T) int32 {
			return a.cuPrimaryCtxRelease(0)
		}},
		{"pop of an empty context stack", "no context on the calling thread to pop", 201, func(t *testing.T) int32 {
			var c uintptr
			return a.cuCtxPopCurrent(&c)
		}},
		{"a size off the granularity", "not a multiple of the granularity", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			var h uint64
			p := prop(0, 1, false)
			return a.cuMemCreate(&h, gran/2, &p, 0)
		}},
		{"a mapping off the granularity", "not a multiple of the granularity", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			h, p := a.created(t, 0, gran, 1), a.reserved(t, 2*gran)
			defer a.cuMemAddressFree(p, 2*gran)
			defer a.cuMemRelease(h)
			return a.cuMemMap(p+4096, gran, 0, h, 0)
		}},
		{"a mapping over a mapping", "already mapped", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			m := a.alloc(t, 0, gran, false)
			defer a.free(t, m)
			h := a.created(t, 0, gran, 1)
			defer a.cuMemRelease(h)
			return a.cuMemMap(m.ptr, gran, 0, h, 0)
		}},
		{"a copy before cuMemSetAccess", "is not accessible (cuMemSetAccess)", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			h, p := a.created(t, 0, gran, 1), a.reserved(t, gran)
			must(t, "cuMemMap", a.cuMemMap(p, gran, 0, h, 0))
			defer a.free(t, devMem{ptr: p, size: gran, h: h})
			src := hostMem(t, 4096)
			return a.cuMemcpyHtoD(p, addr(src), 4096)
		}},
		{"a copy into a reservation not mapped", "is not mapped device memory", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			p := a.reserved(t, gran)
			defer a.cuMemAddressFree(p, gran)
			src := hostMem(t, 4096)
			return a.cuMemcpyHtoD(p, addr(src), 4096)
		}},
		{"access set for another GPU", "device 0 is not the memory's GPU", 101, func(t *testing.T) int32 {
			defer a.onDevice(t, 1)()
			h, p := a.created(t, 1, gran, 1), a.reserved(t, gran)
			must(t, "cuMemMap", a.cuMemMap(p, gran, 0, h, 0))
			defer a.free(t, devMem{ptr: p, size: gran, h: h})
			return a.cuMemSetAccess(p, gran, desc(0), 1)
		}},
		{"access for part of a mapping", "not a fully mapped range", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			m := a.alloc(t, 0, 2*gran, false)
			defer a.free(t, m)
			return a.cuMemSetAccess(m.ptr, gran, desc(0), 1)
		}},
		{"export of a handle type not requested", "was not requested at creation", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			h := a.created(t, 0, gran, 0)
			defer a.cuMemRelease(h)
			var fd int32
			return a.cuMemExport(&fd, h, 1, 0)
		}},
		{"a double release", "already released (use after release)", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			h := a.created(t, 0, gran, 1)
			must(t, "cuMemRelease", a.cuMemRelease(h))
			return a.cuMemRelease(h)
		}},
		{"a mapping of a released handle", "already released (use after release)", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			h, p := a.created(t, 0, gran, 1), a.reserved(t, gran)
			defer a.cuMemAddressFree(p, gran)
			must(t, "cuMemRelease", a.cuMemRelease(h))
			return a.cuMemMap(p, gran, 0, h, 0)
		}},
		{"an unmap of what is not mapped", "is not what was mapped", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			p := a.reserved(t, gran)
			defer a.cuMemAddressFree(p, gran)
			return a.cuMemUnmap(p, gran)
		}},
		{"an unmap of part of a mapping", "is not what was mapped", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			m := a.alloc(t, 0, 2*gran, false)
			defer a.free(t, m)
			return a.cuMemUnmap(m.ptr, gran)
		}},
		{"freeing a reservation still mapped", "still has a mapping", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			m := a.alloc(t, 0, gran, false)
			defer a.free(t, m)
			return a.cuMemAddressFree(m.ptr, m.size)
		}},
		{"freeing a reservation by another size", "is not a reservation", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			p := a.reserved(t, 2*gran)
			defer a.cuMemAddressFree(p, 2*gran)
			return a.cuMemAddressFree(p, gran)
		}},
		{"a stream destroyed twice", "was destroyed", 400, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			var s uintptr
			must(t, "cuStreamCreate", a.cuStreamCreate(&s, 1))
			must(t, "cuStreamDestroy", a.cuStreamDestroy(s))
			return a.cuStreamDestroy(s)
		}},
		{"an event recorded after destroy", "was destroyed", 400, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			var e uintptr
			must(t, "cuEventCreate", a.cuEventCreate(&e, 2))
			must(t, "cuEventDestroy", a.cuEventDestroy(e))
			return a.cuEventRecord(e, 0)
		}},
		{"an event and a stream of two contexts", "not from the same context", 400, func(t *testing.T) int32 {
			var s, e uintptr
			done1 := a.onDevice(t, 1)
			must(t, "cuStreamCreate", a.cuStreamCreate(&s, 1))
			done0 := a.onDevice(t, 0)
			must(t, "cuEventCreate", a.cuEventCreate(&e, 2))
			code := a.cuEventRecord(e, s)
			must(t, "cuEventDestroy", a.cuEventDestroy(e))
			done0()
			must(t, "cuStreamDestroy", a.cuStreamDestroy(s))
			done1()
			return code
		}},
		{"an interprocess event with timing", "CU_EVENT_INTERPROCESS without", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			var e uintptr
			return a.cuEventCreate(&e, 4)
		}},
		{"a host range registered twice", "overlaps the registered", 712, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			b := hostMem(t, 3*4096)
			must(t, "cuMemHostRegister", a.cuMemHostRegister(addr(b), 2*4096, 1))
			defer a.cuMemHostUnregister(addr(b))
			return a.cuMemHostRegister(addr(b)+4096, 2*4096, 1)
		}},
		{"an unregister of what is not registered", "is not a registered base", 713, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			b := hostMem(t, 4096)
			return a.cuMemHostUnregister(addr(b))
		}},
		{"a host range not mapped", "is not all mapped", 1, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			b := hostMem(t, 2*4096)
			if _, _, e := syscall.Syscall(syscall.SYS_MUNMAP, addr(b)+4096, 4096, 0); e != 0 {
				t.Fatal(e)
			}
			return a.cuMemHostRegister(addr(b), 2*4096, 1)
		}},
		{"a read-only host range without READ_ONLY", "mapped read-only", 801, func(t *testing.T) int32 {
			defer a.onDevice(t, 0)()
			b := hostMem(t, 4096)
			syscall.Mprotect(b, syscall.PROT_READ)
			return a.cuMemHostRegister(addr(b), 4096, 1)
		}},
		{"a runtime call without cudaSetDevice", "implicit context on device 0", 201, func(t *testing.T) int32 {
			var s uintptr
			return a.cudaStreamCreate(&s, 1)
		}},
		{"cudaHostRegister without cudaSetDevice", "cudaHostRegister: implicit context", 201, func(t *testing.T) int32 {
			b := hostMem(t, 4096)
			return a.cudaHostRegister(addr(b), 4096, 1)
		}},
		{"a 2D copy whose pitch is less than its width", "is more than a pitch", 12, func(t *testing.T) int32 {
			defer a.onDevice(t, 1)()
			must(t, "cudaSetDevice", a.cudaSetDevice(1))
			m := a.alloc(t, 1, gran, false)
			defer a.free(t, m)
			b := hostMem(t, 4096)
			return a.cudaMemcpy2DAsync(m.ptr, 100, addr(b), 200, 150, 2, 1, 0)
		}},
		{"a device that does not exist", "device 5 does not exist", 101, func(t *testing.T) int32 {
			var d int32
			return a.cuDeviceGet(&d, 5)
		}},
		{"an attribute not modelled", "attribute 1 is not modelled", 1, func(t *testing.T) int32 {
			var v int32
			return a.cuDeviceGetAttribute(&v, 1, 0)
		}},
		{"an entry point not implemented", "cuLaunchKernel is not implemented", 500, func(t *testing.T) int32 {
			var fn uintptr
			var status int32
			return a.cuGetProcAddress("cuLaunchKernel", &fn, 12000, 0, &status)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			runtime.LockOSThread() // never unlocked: the thread ends with the case
			before := a.report(t)
			if got := c.run(t); got != c.code {
				t.Errorf("returned %d, want %d", got, c.code)
			}
			a.wantViolation(t, before, c.violation)
		})
	}
}

// TestTouchBeforeAccessFaults: a mapping is not accessible until
// cuMemSetAccess (cuMemMap "does not make the address accessible"): a
// touch faults, after it the bytes are there.
func TestTouchBeforeAccessFaults(t *testing.T) {
	a := loadAPI(t)
	defer a.onDevice(t, 0)()
	h, p := a.created(t, 0, gran, 1), a.reserved(t, gran)
	must(t, "cuMemMap", a.cuMemMap(p, gran, 0, h, 0))
	defer a.free(t, devMem{ptr: p, size: gran, h: h})
	touch := func() (faulted bool) {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() { faulted = recover() != nil }()
		bytesAt(p, 1)[0] = 1
		return false
	}
	if !touch() {
		t.Fatalf("a touch of a mapping before cuMemSetAccess did not fault")
	}
	access := cuda.MemAccessDesc{Location: cuda.MemLocation{Type: 1, ID: 0}, Flags: 3}
	must(t, "cuMemSetAccess", a.cuMemSetAccess(p, gran, &access, 1))
	if touch() {
		t.Fatalf("a touch after cuMemSetAccess faulted")
	}
}

// TestDriverEntryPoints: the runtime hands out the driver's functions by
// their base names at their current ABI version, as cuGetProcAddress does.
func TestDriverEntryPoints(t *testing.T) {
	a := loadAPI(t)
	for _, name := range []string{"cuMemCreate", "cuCtxPushCurrent", "cuDeviceGetUuid", "cuMemcpyHtoD", "cuStreamDestroy"} {
		var fn uintptr
		var status int32
		if code := a.cuGetProcAddress(name, &fn, 12000, 0, &status); code != 0 || fn == 0 || status != 0 {
			t.Errorf("%s: code %d, function %#x, status %d", name, code, fn, status)
		}
	}
}
