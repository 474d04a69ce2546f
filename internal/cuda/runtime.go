// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"bytes"
	"fmt"
	"runtime"
)

// Stream and event flags, and the copy kind (driver_types.h).
const (
	streamNonBlocking    = 0x01 // cudaStreamNonBlocking
	eventBlockingSync    = 0x01 // cudaEventBlockingSync
	eventDisableTiming   = 0x02 // cudaEventDisableTiming
	memcpyHostToDevice   = 1    // cudaMemcpyHostToDevice
	hostRegisterPortable = 1    // cudaHostRegisterPortable
)

// SetDevice makes device current on the calling OS thread (binding its
// primary context). Call it on a locked thread (Thread does).
func (r *Runtime) SetDevice(device int) error {
	return r.check("cudaSetDevice", r.setDevice(int32(device)))
}

// Stream is a CUDA stream (cudaStream_t).
type Stream uintptr

// Event is a CUDA event (cudaEvent_t).
type Event uintptr

// NewStream creates a non-blocking stream on the current device.
func (r *Runtime) NewStream() (Stream, error) {
	var s uintptr
	if err := r.check("cudaStreamCreateWithFlags", r.streamCreate(&s, streamNonBlocking)); err != nil {
		return 0, err
	}
	return Stream(s), nil
}

// DestroyStream destroys s.
func (r *Runtime) DestroyStream(s Stream) error {
	return r.check("cudaStreamDestroy", r.streamDestroy(uintptr(s)))
}

// NewEvent creates an event without timing whose wait blocks the thread
// (BlockingSync) rather than spinning a core for the length of a copy.
func (r *Runtime) NewEvent() (Event, error) {
	var e uintptr
	if err := r.check("cudaEventCreateWithFlags", r.eventCreate(&e, eventBlockingSync|eventDisableTiming)); err != nil {
		return 0, err
	}
	return Event(e), nil
}

// Record records e on s.
func (r *Runtime) Record(e Event, s Stream) error {
	return r.check("cudaEventRecord", r.eventRecord(uintptr(e), uintptr(s)))
}

// Wait blocks until the work recorded by e is done.
func (r *Runtime) Wait(e Event) error {
	return r.check("cudaEventSynchronize", r.eventSynchronize(uintptr(e)))
}

// DestroyEvent destroys e.
func (r *Runtime) DestroyEvent(e Event) error {
	return r.check("cudaEventDestroy", r.eventDestroy(uintptr(e)))
}

// CopyToDevice enqueues a copy of registered host memory src to device address dst on s.
// src must stay unchanged until the copy completes.
func (r *Runtime) CopyToDevice(dst uintptr, src []byte, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	err := r.check("cudaMemcpyAsync", r.memcpyAsync(dst, uintptrOf(src), uintptr(len(src)), memcpyHostToDevice, uintptr(s)))
	runtime.KeepAlive(src)
	return err
}

// CopyToDevice2D enqueues one strided copy of rows rows of width bytes on s.
// Row i goes from src[i·srcPitch:] to dst + i·dstPitch; src is as for CopyToDevice.
func (r *Runtime) CopyToDevice2D(dst uintptr, dstPitch int64, src []byte, srcPitch, width int64, rows int, s Stream) error {
	if rows == 0 || width == 0 {
		return nil
	}
	if width > srcPitch || width > dstPitch || int64(len(src)) < int64(rows-1)*srcPitch+width {
		return fmt.Errorf("cuda: 2D copy of %d rows of %d bytes (pitches %d, %d) from %d bytes", rows, width, srcPitch, dstPitch, len(src))
	}
	err := r.check("cudaMemcpy2DAsync", r.memcpy2DAsync(dst, uintptr(dstPitch), uintptrOf(src), uintptr(srcPitch),
		uintptr(width), uintptr(rows), memcpyHostToDevice, uintptr(s)))
	runtime.KeepAlive(src)
	return err
}

// PCIBusID returns device's PCI bus id ("0000:3B:00.0").
func (r *Runtime) PCIBusID(device int) (string, error) {
	buf := make([]byte, 32)
	if err := r.check("cudaDeviceGetPCIBusId", r.pciBusID(&buf[0], int32(len(buf)), int32(device))); err != nil {
		return "", err
	}
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		buf = buf[:i]
	}
	return string(buf), nil
}
