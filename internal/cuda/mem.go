// SPDX-License-Identifier: Apache-2.0

package cuda

import "unsafe"

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
