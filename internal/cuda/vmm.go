// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The driver API's exportable memory (virtual memory management), bound
// through the runtime's driver entry points, so that only libcudart is
// loaded by name. Mirrors of cuda.h's structs; abi_test.go checks their
// sizes, offsets and constants against the header.

// MemLocation mirrors CUmemLocation.
type MemLocation struct {
	Type int32 // memLocationTypeDevice
	ID   int32 // the device ordinal
}

// MemAllocationProp mirrors CUmemAllocationProp (32 bytes).
type MemAllocationProp struct {
	Type                 int32 // memAllocationTypePinned
	RequestedHandleTypes int32 // memHandleTypePosixFD
	Location             MemLocation
	Win32HandleMetaData  uintptr
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]uint8
}

// MemAccessDesc mirrors CUmemAccessDesc (12 bytes).
type MemAccessDesc struct {
	Location MemLocation
	Flags    int32 // memAccessReadWrite
}

// cuda.h's constants used here.
const (
	memAllocationTypePinned = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	memHandleTypePosixFD    = 1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	memLocationTypeDevice   = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	memAccessReadWrite      = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	memGranularityMinimum   = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	driverEntryVersion      = 12000
)

// ErrNoVMM is returned (wrapped) when the runtime cannot reach the driver's
// memory-management functions (a runtime older than CUDA 12.5, or a
// driver without them).
var ErrNoVMM = errors.New("no exportable device memory (CUDA virtual memory management) here")

// Driver holds the driver functions device memory needs.
type Driver struct {
	rt                *Runtime
	getErrorName      func(int32, **byte) int32
	getErrorString    func(int32, **byte) int32
	granularity       func(*uintptr, *MemAllocationProp, int32) int32
	create            func(*uint64, uintptr, *MemAllocationProp, uint64) int32
	release           func(uint64) int32
	addressReserve    func(*uintptr, uintptr, uintptr, uintptr, uint64) int32
	addressFree       func(uintptr, uintptr) int32
	mapMem            func(uintptr, uintptr, uintptr, uint64, uint64) int32
	unmap             func(uintptr, uintptr) int32
	setAccess         func(uintptr, uintptr, *MemAccessDesc, uintptr) int32
	exportToShareable func(unsafe.Pointer, uint64, int32, uint64) int32
}

// driverSymbols are the driver functions Driver resolves, by name.
func (d *Driver) driverSymbols() map[string]any {
	return map[string]any{
		"cuGetErrorName": &d.getErrorName, "cuGetErrorString": &d.getErrorString,
		"cuMemGetAllocationGranularity": &d.granularity, "cuMemCreate": &d.create, "cuMemRelease": &d.release,
		"cuMemAddressReserve": &d.addressReserve, "cuMemAddressFree": &d.addressFree, "cuMemMap": &d.mapMem,
		"cuMemUnmap": &d.unmap, "cuMemSetAccess": &d.setAccess, "cuMemExportToShareableHandle": &d.exportToShareable,
	}
}

// Driver resolves the driver's memory-management functions. It needs a
// driver; call it on a Thread.
func (r *Runtime) Driver() (*Driver, error) {
	if r.entryPoint == nil {
		return nil, fmt.Errorf("cuda: %w: %s has no cudaGetDriverEntryPointByVersion (CUDA 12.5 or later)", ErrNoVMM, r.Path)
	}
	d := &Driver{rt: r}
	for name, fn := range d.driverSymbols() {
		var p uintptr
		var status int32
		if err := r.check("cudaGetDriverEntryPointByVersion "+name, r.entryPoint(name, &p, driverEntryVersion, 0, &status)); err != nil {
			return nil, err
		}
		if p == 0 || status != 0 {
			return nil, fmt.Errorf("cuda: %w: the driver has no %s (query status %d)", ErrNoVMM, name, status)
		}
		purego.RegisterFunc(fn, p)
	}
	return d, nil
}

func (d *Driver) check(call string, code int32) error {
	if code == 0 {
		return nil
	}
	e := &Error{Call: call, Code: code, Name: "CUDA_ERROR", Msg: "unknown"}
	var p *byte
	if d.getErrorName(code, &p) == 0 && p != nil {
		e.Name = goString(p)
	}
	if d.getErrorString(code, &p) == 0 && p != nil {
		e.Msg = goString(p)
	}
	return e
}

// DeviceMemory is exportable device memory: created with a POSIX file
// descriptor handle type, mapped read-write for its device at Ptr.
type DeviceMemory struct {
	Ptr    uintptr
	Size   int64 // a multiple of the device's allocation granularity
	Device int
	handle uint64
	d      *Driver
}

// Alloc allocates at least size bytes of exportable memory on device
// (rounded up to the allocation granularity), never managed memory. Call
// it on the device's Thread.
func (d *Driver) Alloc(device int, size int64) (*DeviceMemory, error) {
	prop := MemAllocationProp{Type: memAllocationTypePinned, RequestedHandleTypes: memHandleTypePosixFD,
		Location: MemLocation{Type: memLocationTypeDevice, ID: int32(device)}}
	var gran uintptr
	if err := d.check("cuMemGetAllocationGranularity", d.granularity(&gran, &prop, memGranularityMinimum)); err != nil {
		return nil, err
	}
	size = (size + int64(gran) - 1) / int64(gran) * int64(gran)
	m := &DeviceMemory{Size: size, Device: device, d: d}
	if err := d.check("cuMemCreate", d.create(&m.handle, uintptr(size), &prop, 0)); err != nil {
		return nil, fmt.Errorf("%w (%d bytes on device %d)", err, size, device)
	}
	if err := d.check("cuMemAddressReserve", d.addressReserve(&m.Ptr, uintptr(size), 0, 0, 0)); err != nil {
		d.release(m.handle)
		return nil, err
	}
	if err := d.check("cuMemMap", d.mapMem(m.Ptr, uintptr(size), 0, m.handle, 0)); err != nil {
		d.addressFree(m.Ptr, uintptr(size))
		d.release(m.handle)
		return nil, err
	}
	access := MemAccessDesc{Location: prop.Location, Flags: memAccessReadWrite}
	if err := d.check("cuMemSetAccess", d.setAccess(m.Ptr, uintptr(size), &access, 1)); err != nil {
		m.Free()
		return nil, err
	}
	return m, nil
}

// Export returns a new file descriptor for the memory (another process
// imports it with cuMemImportFromShareableHandle). Call it on the Thread.
func (m *DeviceMemory) Export() (*os.File, error) {
	var fd int32 = -1
	if err := m.d.check("cuMemExportToShareableHandle", m.d.exportToShareable(unsafe.Pointer(&fd), m.handle, memHandleTypePosixFD, 0)); err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), fmt.Sprintf("cuda-vmm-device%d", m.Device)), nil
}

// Free unmaps and releases the memory; an importer's mapping keeps the
// physical memory alive until it unmaps. Call it on the Thread.
func (m *DeviceMemory) Free() error {
	var errs []error
	if m.Ptr != 0 {
		errs = append(errs, m.d.check("cuMemUnmap", m.d.unmap(m.Ptr, uintptr(m.Size))),
			m.d.check("cuMemAddressFree", m.d.addressFree(m.Ptr, uintptr(m.Size))))
		m.Ptr = 0
	}
	if m.handle != 0 {
		errs = append(errs, m.d.check("cuMemRelease", m.d.release(m.handle)))
		m.handle = 0
	}
	return errors.Join(errs...)
}
