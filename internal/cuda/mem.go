package cuda

import (
	"unsafe"

	"github.com/ebitengine/purego"
)

// uintptrOf is the address of b's first byte; b must be outside the Go
// heap (mmap'd) when C keeps using it after the call.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// goString copies the NUL-terminated C string at p.
func goString(p *byte) string {
	var n int
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// registerFunc binds the C function at addr to the Go function variable fn.
func registerFunc(fn any, addr uintptr) { purego.RegisterFunc(fn, addr) }
