// SPDX-License-Identifier: Apache-2.0

package cuda

// memcpyDeviceToDevice is cudaMemcpyDeviceToDevice (driver_types.h).
const memcpyDeviceToDevice = 3

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
