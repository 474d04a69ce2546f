// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"
)

// cuFile (GPUDirect Storage) reads O_DIRECT files into device memory.
// Every call must run on a Thread of the device.

// FileDescr mirrors CUfileDescr_t (24 bytes): the handle type, a union of
// an fd and a pointer, and the file system operations (nil).
type FileDescr struct {
	Type   int32 // fileHandleTypeOpaqueFD
	_      [4]byte
	Handle uintptr // the fd, in the union's low bytes
	FSOps  uintptr
}

// cufile.h's constants and the stats level-3 layout read here (checked
// against the header by abi_test.go).
const (
	fileHandleTypeOpaqueFD = 1    // CU_FILE_HANDLE_TYPE_OPAQUE_FD
	cuFileBaseErr          = 5000 // CUFILEOP_BASE_ERR
	cuFileCUDADriverError  = 5011 // CU_FILE_CUDA_DRIVER_ERROR

	drvPropsSize          = 56 // sizeof(CUfileDrvProps_t)
	drvPropsMajor         = 0  // offsetof(CUfileDrvProps_t, nvfs.major_version)
	drvPropsMinor         = 4  // nvfs.minor_version
	drvPropsDStatusFlags  = 24 // nvfs.dstatusflags
	drvPropsDControlFlags = 28 // nvfs.dcontrolflags
	drvPropsFFlags        = 32 // fflags

	statsL3Size       = 5000 // sizeof(CUfileStatsLevel3_t)
	statsL3NumGPUs    = 1024 // offsetof(CUfileStatsLevel3_t, num_gpus)
	statsL3PerGPU     = 1032 // offsetof(CUfileStatsLevel3_t, per_gpu_stats)
	perGPUSize        = 248  // sizeof(CUfilePerGpuStats_t)
	perGPUUUID        = 0    // offsetof(CUfilePerGpuStats_t, uuid)
	gpuUUIDLen        = 16   // CUFILE_GPU_UUID_LEN
	perGPUTotalReads  = 48   // offsetof(CUfilePerGpuStats_t, n_total_reads)
	perGPUP2PReads    = 56   // n_p2p_reads
	perGPUNVFSReads   = 64   // n_nvfs_reads
	perGPUPosixReads  = 72   // n_posix_reads
	statsL3MaxGPUs    = 16
	cuFileStatsLevel3 = 3
)

// cuFileErrorNames names every CUfileOpError of cufile.h (cuFile 1.15,
// checked against the header by TestErrorNamesMatchHeader).
var cuFileErrorNames = map[int32]string{
	5001: "CU_FILE_DRIVER_NOT_INITIALIZED",
	5002: "CU_FILE_DRIVER_INVALID_PROPS",
	5003: "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
	5004: "CU_FILE_DRIVER_VERSION_MISMATCH",
	5005: "CU_FILE_DRIVER_VERSION_READ_ERROR",
	5006: "CU_FILE_DRIVER_CLOSING",
	5007: "CU_FILE_PLATFORM_NOT_SUPPORTED",
	5008: "CU_FILE_IO_NOT_SUPPORTED",
	5009: "CU_FILE_DEVICE_NOT_SUPPORTED",
	5010: "CU_FILE_NVFS_DRIVER_ERROR",
	5011: "CU_FILE_CUDA_DRIVER_ERROR",
	5012: "CU_FILE_CUDA_POINTER_INVALID",
	5013: "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
	5014: "CU_FILE_CUDA_POINTER_RANGE_ERROR",
	5015: "CU_FILE_CUDA_CONTEXT_MISMATCH",
	5016: "CU_FILE_INVALID_MAPPING_SIZE",
	5017: "CU_FILE_INVALID_MAPPING_RANGE",
	5018: "CU_FILE_INVALID_FILE_TYPE",
	5019: "CU_FILE_INVALID_FILE_OPEN_FLAG",
	5020: "CU_FILE_DIO_NOT_SET",
	5022: "CU_FILE_INVALID_VALUE",
	5023: "CU_FILE_MEMORY_ALREADY_REGISTERED",
	5024: "CU_FILE_MEMORY_NOT_REGISTERED",
	5025: "CU_FILE_PERMISSION_DENIED",
	5026: "CU_FILE_DRIVER_ALREADY_OPEN",
	5027: "CU_FILE_HANDLE_NOT_REGISTERED",
	5028: "CU_FILE_HANDLE_ALREADY_REGISTERED",
	5029: "CU_FILE_DEVICE_NOT_FOUND",
	5030: "CU_FILE_INTERNAL_ERROR",
	5031: "CU_FILE_GETNEWFD_FAILED",
	5033: "CU_FILE_NVFS_SETUP_ERROR",
	5034: "CU_FILE_IO_DISABLED",
	5035: "CU_FILE_BATCH_SUBMIT_FAILED",
	5036: "CU_FILE_GPU_MEMORY_PINNING_FAILED",
	5037: "CU_FILE_BATCH_FULL",
	5038: "CU_FILE_ASYNC_NOT_SUPPORTED",
	5039: "CU_FILE_INTERNAL_BATCH_SETUP_ERROR",
	5040: "CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR",
	5041: "CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR",
	5042: "CU_FILE_INTERNAL_BATCH_CANCEL_ERROR",
	5043: "CU_FILE_NOMEM_ERROR",
	5044: "CU_FILE_IO_ERROR",
	5045: "CU_FILE_INTERNAL_BUF_REGISTER_ERROR",
	5046: "CU_FILE_HASH_OPR_ERROR",
	5047: "CU_FILE_INVALID_CONTEXT_ERROR",
	5048: "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR",
	5049: "CU_FILE_BATCH_NOCOMPAT_ERROR",
	5050: "CU_FILE_IO_MAX_ERROR",
}

// The cuFile errors callers branch on.
const (
	FileDriverAlreadyOpen = 5026 // CU_FILE_DRIVER_ALREADY_OPEN
)

// FileError is a cuFile error: the call, cuFile's code and name, and the
// CUDA driver's code when cuFile says the driver failed.
type FileError struct {
	Call  string
	Code  int32         // CUfileOpError, or -errno from cuFileRead
	CUDA  int32         // CUresult with CU_FILE_CUDA_DRIVER_ERROR
	Errno syscall.Errno // cuFileRead's errno (Code is then its negation)
}

// Unwrap returns the errno, if any: errors.Is(err, syscall.EIO) holds for
// a read that failed with EIO.
func (e *FileError) Unwrap() error {
	if e.Errno != 0 {
		return e.Errno
	}
	return nil
}

// Name is cuFile's name for the code ("CU_FILE_IO_NOT_SUPPORTED"), or the
// errno's.
func (e *FileError) Name() string {
	if n, ok := cuFileErrorNames[e.Code]; ok {
		return n
	}
	if e.Errno != 0 {
		return fmt.Sprintf("errno %d (%v)", int(e.Errno), e.Errno)
	}
	if e.Code < 0 {
		return fmt.Sprintf("errno %d (%v)", -e.Code, syscall.Errno(-e.Code))
	}
	return fmt.Sprintf("CU_FILE_ERROR_%d", e.Code)
}

// Error returns "CALL: NAME" (with the CUDA driver error when there is one).
func (e *FileError) Error() string {
	if e.CUDA != 0 {
		return fmt.Sprintf("%s: %s (CUDA driver error %d)", e.Call, e.Name(), e.CUDA)
	}
	return fmt.Sprintf("%s: %s", e.Call, e.Name())
}

// fileErr unpacks a CUfileError_t returned in RAX: err in the low 32
// bits, cu_err in the high.
func fileErr(call string, r uint64) error {
	if int32(r) == 0 {
		return nil
	}
	return &FileError{Call: call, Code: int32(r), CUDA: int32(r >> 32)}
}

// CuFileLib is a loaded libcufile.
type CuFileLib struct {
	Path             string // the library loaded (Found.Path)
	Found            Found  // where it was found and how
	driverOpen       func() uint64
	driverClose      func() uint64
	driverProps      func(unsafe.Pointer) uint64
	handleRegister   func(*uintptr, *FileDescr) uint64
	handleDeregister func(uintptr)
	bufRegister      func(uintptr, uintptr, int32) uint64
	bufDeregister    func(uintptr) uint64
	read             func(fh, buf, size uintptr, fileOff, bufOff int64) int64
	setStatsLevel    func(int32) uint64
	statsStart       func() uint64
	getStatsL3       func(unsafe.Pointer) uint64
	getVersion       func(*int32) uint64 // optional: cuFile 1.8 and later
	errnoLocation    func() *int32       // libc's __errno_location: this thread's errno
}

func (c *CuFileLib) symbols() map[string]any {
	return map[string]any{
		"cuFileDriverOpen": &c.driverOpen, "cuFileDriverClose_v2": &c.driverClose,
		"cuFileDriverGetProperties": &c.driverProps,
		"cuFileHandleRegister":      &c.handleRegister, "cuFileHandleDeregister": &c.handleDeregister,
		"cuFileBufRegister": &c.bufRegister, "cuFileBufDeregister": &c.bufDeregister, "cuFileRead": &c.read,
		"cuFileSetStatsLevel": &c.setStatsLevel, "cuFileStatsStart": &c.statsStart, "cuFileGetStatsL3": &c.getStatsL3,
	}
}

// LoadCuFile loads libcufile: the file at path, or with path "" the one
// discovery finds (SearchFromEnv).
func LoadCuFile(path string) (*CuFileLib, error) {
	if path == "" {
		return LoadCuFileFrom(SearchFromEnv())
	}
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("cuda: no libcufile: %w", err)
	}
	return bindCuFile(lib, Found{Path: path, From: "given"})
}

// LoadCuFileFrom loads the libcufile discovery finds in s.
func LoadCuFileFrom(s Search) (*CuFileLib, error) {
	lib, found, err := s.open(Cufile())
	if err != nil {
		return nil, fmt.Errorf("cuda: no libcufile: %w", err)
	}
	return bindCuFile(lib, found)
}

func bindCuFile(lib uintptr, found Found) (*CuFileLib, error) {
	c := &CuFileLib{Path: found.Path, Found: found}
	if err := bind(lib, found.Path, c.symbols()); err != nil {
		return nil, err
	}
	if sym, err := purego.Dlsym(lib, "cuFileGetVersion"); err == nil {
		purego.RegisterFunc(&c.getVersion, sym)
	}
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("cuda: libc for cuFileRead's errno: %w", err)
	}
	if err := bind(libc, "libc.so.6", map[string]any{"__errno_location": &c.errnoLocation}); err != nil {
		return nil, err
	}
	return c, nil
}

// Version returns the library's version (cuFileGetVersion: 1000·major +
// 10·minor, 1150 for 1.15), without opening the driver.
func (c *CuFileLib) Version() (int, error) {
	if c.getVersion == nil {
		return 0, fmt.Errorf("cuda: %s has no cuFileGetVersion (before cuFile 1.8)", c.Path)
	}
	var v int32
	if err := fileErr("cuFileGetVersion", c.getVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// FormatCuFileVersion renders cuFile's version encoding as "major.minor".
func FormatCuFileVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// Open opens the cuFile driver and turns on per-GPU statistics (level 3),
// from which Mode reads what ran. Call it on a Thread.
func (c *CuFileLib) Open() error {
	if err := fileErr("cuFileDriverOpen", c.driverOpen()); err != nil {
		return err
	}
	if err := fileErr("cuFileSetStatsLevel", c.setStatsLevel(cuFileStatsLevel3)); err != nil {
		return err
	}
	return fileErr("cuFileStatsStart", c.statsStart())
}

// Close closes the driver.
func (c *CuFileLib) Close() error { return fileErr("cuFileDriverClose", c.driverClose()) }

// RegisterFile registers an fd (opened O_DIRECT) and returns its handle.
func (c *CuFileLib) RegisterFile(fd int) (uintptr, error) {
	d := FileDescr{Type: fileHandleTypeOpaqueFD, Handle: uintptr(uint32(fd))}
	var h uintptr
	if err := fileErr("cuFileHandleRegister", c.handleRegister(&h, &d)); err != nil {
		return 0, err
	}
	return h, nil
}

// DeregisterFile releases a handle.
func (c *CuFileLib) DeregisterFile(h uintptr) { c.handleDeregister(h) }

// RegisterBuffer registers device memory for direct DMA; a failure is not fatal.
func (c *CuFileLib) RegisterBuffer(ptr uintptr, size int64) error {
	return fileErr("cuFileBufRegister", c.bufRegister(ptr, uintptr(size), 0))
}

// DeregisterBuffer undoes RegisterBuffer.
func (c *CuFileLib) DeregisterBuffer(ptr uintptr) error {
	return fileErr("cuFileBufDeregister", c.bufDeregister(ptr))
}

// Read reads size bytes at fileOff into the registered buffer base at bufOff.
// A failure is a *FileError; call Read on a Thread so errno is this thread's.
func (c *CuFileLib) Read(fh, base uintptr, size int64, fileOff, bufOff int64) (int64, error) {
	n := c.read(fh, base, uintptr(size), fileOff, bufOff)
	if n >= 0 {
		return n, nil
	}
	if n == -1 {
		errno := syscall.Errno(*c.errnoLocation())
		if errno == 0 {
			return 0, &FileError{Call: "cuFileRead", Code: -1, Errno: syscall.EPERM}
		}
		return 0, &FileError{Call: "cuFileRead", Code: -int32(errno), Errno: errno}
	}
	code := int32(-n)
	if code <= cuFileBaseErr {
		return 0, &FileError{Call: "cuFileRead", Code: int32(n), Errno: syscall.Errno(code)}
	}
	return 0, &FileError{Call: "cuFileRead", Code: code}
}

// DriverProps are the cuFile driver's properties that say how it reads.
type DriverProps struct {
	NVFSMajor, NVFSMinor uint32 // nvidia-fs's version: 0.0 when it is not loaded
	DStatusFlags         uint32 // CUfileDriverStatusFlags_t bits
	DControlFlags        uint32 // CUfileDriverControlFlags_t bits
	FFlags               uint32 // CUfileFeatureFlags_t bits
}

// NVFS says whether nvidia-fs (the kernel module of GDS's direct path)
// is loaded.
func (p DriverProps) NVFS() bool { return p.NVFSMajor != 0 || p.NVFSMinor != 0 }

// Properties returns the open driver's properties
// (cuFileDriverGetProperties).
func (c *CuFileLib) Properties() (DriverProps, error) {
	b := make([]byte, drvPropsSize)
	if err := fileErr("cuFileDriverGetProperties", c.driverProps(unsafe.Pointer(&b[0]))); err != nil {
		return DriverProps{}, err
	}
	return parseDriverProps(b), nil
}

func parseDriverProps(b []byte) DriverProps {
	le := binary.LittleEndian
	return DriverProps{NVFSMajor: le.Uint32(b[drvPropsMajor:]), NVFSMinor: le.Uint32(b[drvPropsMinor:]),
		DStatusFlags: le.Uint32(b[drvPropsDStatusFlags:]), DControlFlags: le.Uint32(b[drvPropsDControlFlags:]),
		FFlags: le.Uint32(b[drvPropsFFlags:])}
}

// GPUReads are one GPU's read counts from cuFile's level-3 statistics.
type GPUReads struct {
	UUID                    string // the GPU's, as FormatUUID writes it
	Total, P2P, NVFS, POSIX uint64
}

// Mode says what the counts show: "gds", "compat", "mixed", or "none" before any read.
func (r GPUReads) Mode() string {
	direct := r.P2P + r.NVFS
	switch {
	case direct > 0 && r.POSIX == 0:
		return "gds"
	case direct == 0 && r.POSIX > 0:
		return "compat"
	case direct > 0:
		return "mixed"
	}
	return "none"
}

// Reads returns the read counts of each GPU cuFile's statistics list; match them by UUID.
func (c *CuFileLib) Reads() ([]GPUReads, error) {
	buf := make([]byte, statsL3Size)
	if err := fileErr("cuFileGetStatsL3", c.getStatsL3(unsafe.Pointer(&buf[0]))); err != nil {
		return nil, err
	}
	return parseStatsL3(buf)
}

// parseStatsL3 reads the per-GPU read counts of a CUfileStatsLevel3_t.
func parseStatsL3(b []byte) ([]GPUReads, error) {
	if len(b) < statsL3Size {
		return nil, errors.New("cuda: cuFile statistics cut short")
	}
	le := binary.LittleEndian
	n := int(le.Uint32(b[statsL3NumGPUs:]))
	if n > statsL3MaxGPUs {
		return nil, fmt.Errorf("cuda: cuFile statistics name %d GPUs (at most %d)", n, statsL3MaxGPUs)
	}
	out := make([]GPUReads, n)
	for i := range out {
		g := b[statsL3PerGPU+i*perGPUSize:]
		out[i] = GPUReads{UUID: FormatUUID([gpuUUIDLen]byte(g[perGPUUUID : perGPUUUID+gpuUUIDLen])),
			Total: le.Uint64(g[perGPUTotalReads:]), P2P: le.Uint64(g[perGPUP2PReads:]),
			NVFS: le.Uint64(g[perGPUNVFSReads:]), POSIX: le.Uint64(g[perGPUPosixReads:])}
	}
	return out, nil
}

// CuFile says whether libcufile loads and, when it does, where it was
// found and its version.
type CuFile struct {
	Found   Found // where it was found, zero when none loaded
	Version int   // cuFileGetVersion, 0 unknown
	Err     error // why none loaded, or why its version is unknown
}

// ProbeCuFile loads libcufile and reads its version without opening the driver.
func ProbeCuFile(s Search) CuFile {
	c, err := LoadCuFileFrom(s)
	if err != nil {
		return CuFile{Err: err}
	}
	v, err := c.Version()
	return CuFile{Found: c.Found, Version: v, Err: err}
}
