// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"fmt"
	"runtime"
)

// memcpyDeviceToDevice is cudaMemcpyDeviceToDevice (driver_types.h).
const memcpyDeviceToDevice = 3

// Copy2DToDevice enqueues on s one copy of height rows of width bytes
// from src (host memory outside the Go heap, registered with HostRegister
// for DMA), row i at src[i·spitch:], to the device, row i at
// dst + i·dpitch (cudaMemcpy2DAsync): the packing of rows that lie apart
// in host memory into rows back to back on the device in one call. width
// must not exceed either pitch (CUDA's rule; a pitch is at most the
// device's cudaDevAttrMaxPitch). src must stay mapped and unchanged until
// the copy completes (an event recorded after it).
func (r *Runtime) Copy2DToDevice(dst uintptr, dpitch int64, src []byte, spitch, width int64, height int, s Stream) error {
	if height == 0 || width == 0 {
		return nil
	}
	if width < 0 || height < 0 || width > dpitch || width > spitch || int64(height-1)*spitch+width > int64(len(src)) {
		return fmt.Errorf("cuda: cudaMemcpy2DAsync of %d rows of %d bytes (pitches %d on the device, %d in %d host bytes): out of range", height, width, dpitch, spitch, len(src))
	}
	err := r.check("cudaMemcpy2DAsync", r.memcpy2DAsync(dst, uintptr(dpitch), uintptrOf(src), uintptr(spitch), uintptr(width), uintptr(height), memcpyHostToDevice, uintptr(s)))
	runtime.KeepAlive(src)
	return err
}

// CopyOnDevice enqueues on s a copy of n bytes from the device address src
// to the device address dst (cudaMemcpyAsync, device to device); the
// ranges must not overlap.
func (r *Runtime) CopyOnDevice(dst, src uintptr, n int64, s Stream) error {
	if n <= 0 {
		return nil
	}
	return r.check("cudaMemcpyAsync", r.memcpyAsync(dst, src, uintptr(n), memcpyDeviceToDevice, uintptr(s)))
}

// ZeroDevice enqueues on s the zeroing of n bytes of device memory at dst
// (cudaMemsetAsync).
func (r *Runtime) ZeroDevice(dst uintptr, n int64, s Stream) error {
	if n <= 0 {
		return nil
	}
	return r.check("cudaMemsetAsync", r.memsetAsync(dst, 0, uintptr(n), uintptr(s)))
}
