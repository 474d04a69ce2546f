// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The driver API's exportable memory, bound through the runtime's driver entry points.
// abi_test.go checks the mirrored structs against cuda.h.

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
	// CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: when 1,
	// memory GPUDirect RDMA (and GDS's P2P path) will pin must be created
	// with gpuDirectRDMACapable.
	attrGPUDirectRDMAWithVMM = 110
	memAllocationTypePinned  = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	memHandleTypePosixFD     = 1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	memLocationTypeDevice    = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	memAccessReadWrite       = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	memGranularityMinimum    = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	driverEntryVersion       = 12000
)

// ErrNoVMM is returned (wrapped) when the runtime cannot reach the driver's
// memory-management functions (a runtime older than CUDA 12.5, or a
// driver without them).
var ErrNoVMM = errors.New("no exportable device memory (CUDA virtual memory management) here")

// Driver holds the driver functions device memory and the device queries
// need.
type Driver struct {
	rt                *Runtime
	getErrorName      func(int32, **byte) int32
	getErrorString    func(int32, **byte) int32
	initDriver        func(uint32) int32
	deviceGet         func(*int32, int32) int32
	deviceGetCount    func(*int32) int32
	deviceGetAttr     func(*int32, int32, int32) int32
	deviceGetUUID     func(*[16]byte, int32) int32
	deviceGetPCIBusID func(*byte, int32, int32) int32
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
		"cuGetErrorName": &d.getErrorName, "cuGetErrorString": &d.getErrorString, "cuInit": &d.initDriver,
		"cuDeviceGet": &d.deviceGet, "cuDeviceGetCount": &d.deviceGetCount, "cuDeviceGetAttribute": &d.deviceGetAttr,
		"cuDeviceGetUuid": &d.deviceGetUUID, "cuDeviceGetPCIBusId": &d.deviceGetPCIBusID,
		"cuMemGetAllocationGranularity": &d.granularity, "cuMemCreate": &d.create, "cuMemRelease": &d.release,
		"cuMemAddressReserve": &d.addressReserve, "cuMemAddressFree": &d.addressFree, "cuMemMap": &d.mapMem,
		"cuMemUnmap": &d.unmap, "cuMemSetAccess": &d.setAccess, "cuMemExportToShareableHandle": &d.exportToShareable,
	}
}

// Driver resolves the driver's functions through the runtime once and calls cuInit.
// The memory functions need the device's context: call them on its Thread.
func (r *Runtime) Driver() (*Driver, error) {
	r.driverOnce.Do(func() { r.driver, r.driverErr = r.resolveDriver() })
	return r.driver, r.driverErr
}

func (r *Runtime) resolveDriver() (*Driver, error) {
	if r.entryPoint == nil {
		return nil, fmt.Errorf("cuda: %w: the libcudart loaded has no cudaGetDriverEntryPointByVersion (CUDA 12.5 or later)", ErrNoVMM)
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
	if err := d.check("cuInit", d.initDriver(0)); err != nil {
		return nil, err
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
	Ptr         uintptr
	Size        int64 // a multiple of the device's allocation granularity
	Device      int
	RDMACapable bool // created with gpuDirectRDMACapable
	handle      uint64
	d           *Driver
}

// Alloc allocates at least size bytes of exportable memory on device, on its Thread.
// It is made gpuDirectRDMACapable where the device supports it, as GDS needs.
func (d *Driver) Alloc(device int, size int64) (*DeviceMemory, error) {
	prop := MemAllocationProp{Type: memAllocationTypePinned, RequestedHandleTypes: memHandleTypePosixFD,
		Location: MemLocation{Type: memLocationTypeDevice, ID: int32(device)}}
	rdma, err := d.Attribute(device, attrGPUDirectRDMAWithVMM)
	if err != nil {
		return nil, err
	}
	if rdma == 1 {
		prop.GPUDirectRDMACapable = 1
	}
	var gran uintptr
	if err := d.check("cuMemGetAllocationGranularity", d.granularity(&gran, &prop, memGranularityMinimum)); err != nil {
		return nil, err
	}
	size = (size + int64(gran) - 1) / int64(gran) * int64(gran)
	m := &DeviceMemory{Size: size, Device: device, RDMACapable: rdma == 1, d: d}
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

// Attribute returns a device attribute (CUdevice_attribute) of the device
// with ordinal device.
func (d *Driver) Attribute(device, attr int) (int, error) {
	dev, err := d.device(device)
	if err != nil {
		return 0, err
	}
	var v int32
	if err := d.check(fmt.Sprintf("cuDeviceGetAttribute %d", attr), d.deviceGetAttr(&v, int32(attr), dev)); err != nil {
		return 0, fmt.Errorf("%w (device %d)", err, device)
	}
	return int(v), nil
}

// device returns the driver's handle of the device with ordinal i.
func (d *Driver) device(i int) (int32, error) {
	var dev int32
	if err := d.check("cuDeviceGet", d.deviceGet(&dev, int32(i))); err != nil {
		return 0, fmt.Errorf("%w (device %d)", err, i)
	}
	return dev, nil
}

// Device is one CUDA device as this process numbers it (its
// CUDA_VISIBLE_DEVICES decides the ordinals; the UUID names the GPU the
// same way in every process).
type Device struct {
	Ordinal  int    `json:"ordinal"`
	UUID     string `json:"uuid"` // GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi prints it
	PCIBusID string `json:"pci_bus_id"`
}

// Devices lists the devices with their UUIDs and PCI bus ids. It makes no
// context.
func (d *Driver) Devices() ([]Device, error) {
	var n int32
	if err := d.check("cuDeviceGetCount", d.deviceGetCount(&n)); err != nil {
		return nil, err
	}
	out := make([]Device, 0, n)
	for i := range int(n) {
		dev, err := d.device(i)
		if err != nil {
			return nil, err
		}
		var u [16]byte
		if err := d.check("cuDeviceGetUuid", d.deviceGetUUID(&u, dev)); err != nil {
			return nil, fmt.Errorf("%w (device %d)", err, i)
		}
		bus := make([]byte, 32)
		if err := d.check("cuDeviceGetPCIBusId", d.deviceGetPCIBusID(&bus[0], int32(len(bus)), dev)); err != nil {
			return nil, fmt.Errorf("%w (device %d)", err, i)
		}
		if j := bytes.IndexByte(bus, 0); j >= 0 {
			bus = bus[:j]
		}
		out = append(out, Device{Ordinal: i, UUID: FormatUUID(u), PCIBusID: string(bus)})
	}
	return out, nil
}

// Devices lists this process's devices (Driver.Devices).
func (r *Runtime) Devices() ([]Device, error) {
	d, err := r.Driver()
	if err != nil {
		return nil, err
	}
	return d.Devices()
}

// FormatUUID renders a GPU's 16 UUID bytes as nvidia-smi does:
// GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func FormatUUID(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return "GPU-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// SameUUID says whether a and b name the same GPU: case and a leading
// "GPU-" aside.
func SameUUID(a, b string) bool {
	norm := func(s string) string {
		s = strings.ToLower(strings.TrimSpace(s))
		return strings.TrimPrefix(s, "gpu-")
	}
	return a != "" && norm(a) == norm(b)
}

// FindDevice returns the ordinal of the device uuid names among devs.
func FindDevice(devs []Device, uuid string) (int, bool) {
	for _, d := range devs {
		if SameUUID(d.UUID, uuid) {
			return d.Ordinal, true
		}
	}
	return -1, false
}
