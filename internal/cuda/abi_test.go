// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

// cudaWheels returns the directory holding NVIDIA's nvidia-cuda-runtime and
// nvidia-cufile wheels' include/ and lib/ (make test installs them into
// .venv; NVFEED_CUDA_WHEELS overrides), or skips.
func cudaWheels(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("NVFEED_CUDA_WHEELS"); d != "" {
		return d
	}
	m, _ := filepath.Glob("../../.venv/lib/python3*/site-packages/nvidia/cu13")
	for _, d := range m {
		if _, err := os.Stat(filepath.Join(d, "include", "cuda.h")); err == nil {
			return d
		}
	}
	testenv.SkipPrivileged(t, "NVIDIA's CUDA wheels are not installed (make test installs nvidia-cuda-runtime and nvidia-cufile into .venv)")
	return ""
}

// TestABIMatchesHeaders compiles a probe against NVIDIA's headers and
// compares every size, offset and constant of the mirrored structs and
// enums with the Go side.
func TestABIMatchesHeaders(t *testing.T) {
	dir := cudaWheels(t)
	cc, err := exec.LookPath("cc")
	if err != nil {
		testenv.SkipPrivileged(t, "no C compiler: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "probe")
	if out, err := exec.Command(cc, "-o", bin, "-I", filepath.Join(dir, "include"), "testdata/abi_probe.c").CombinedOutput(); err != nil {
		t.Fatalf("compiling the probe: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	c := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseInt(line[i+1:], 10, 64)
		if err != nil {
			t.Fatalf("probe line %q", line)
		}
		c[line[:i]] = v
	}
	var prop MemAllocationProp
	var access MemAccessDesc
	var loc MemLocation
	var handle uint64
	var descr FileDescr
	want := map[string]int64{
		"sizeof CUfileDescr_t":                         int64(unsafe.Sizeof(descr)),
		"offsetof CUfileDescr_t.type":                  int64(unsafe.Offsetof(descr.Type)),
		"offsetof CUfileDescr_t.handle":                int64(unsafe.Offsetof(descr.Handle)),
		"offsetof CUfileDescr_t.fs_ops":                int64(unsafe.Offsetof(descr.FSOps)),
		"sizeof CUfileError_t":                         8, // returned in RAX as a uint64: err low, cu_err high
		"offsetof CUfileError_t.err":                   0,
		"offsetof CUfileError_t.cu_err":                4,
		"sizeof CUfileHandle_t":                        int64(unsafe.Sizeof(uintptr(0))),
		"sizeof ssize_t":                               8, // cuFileRead's return, an int64
		"sizeof off_t":                                 8, // its offsets, int64
		"sizeof CUfileDrvProps_t":                      drvPropsSize,
		"offsetof CUfileDrvProps_t.nvfs.major_version": drvPropsMajor,
		"offsetof CUfileDrvProps_t.nvfs.minor_version": drvPropsMinor,
		"offsetof CUfileDrvProps_t.nvfs.dstatusflags":  drvPropsDStatusFlags,
		"offsetof CUfileDrvProps_t.nvfs.dcontrolflags": drvPropsDControlFlags,
		"offsetof CUfileDrvProps_t.fflags":             drvPropsFFlags,
		"sizeof CUfileStatsLevel3_t":                   statsL3Size,
		"offsetof CUfileStatsLevel3_t.num_gpus":        statsL3NumGPUs,
		"offsetof CUfileStatsLevel3_t.per_gpu_stats":   statsL3PerGPU,
		"sizeof CUfilePerGpuStats_t":                   perGPUSize,
		"offsetof CUfilePerGpuStats_t.uuid":            perGPUUUID,
		"CUFILE_GPU_UUID_LEN":                          gpuUUIDLen,
		"offsetof CUfilePerGpuStats_t.n_total_reads":   perGPUTotalReads,
		"offsetof CUfilePerGpuStats_t.n_p2p_reads":     perGPUP2PReads,
		"offsetof CUfilePerGpuStats_t.n_nvfs_reads":    perGPUNVFSReads,
		"offsetof CUfilePerGpuStats_t.n_posix_reads":   perGPUPosixReads,
		"per_gpu_stats count":                          statsL3MaxGPUs,
		"CU_FILE_HANDLE_TYPE_OPAQUE_FD":                fileHandleTypeOpaqueFD,
		"CUFILEOP_BASE_ERR":                            cuFileBaseErr,

		"sizeof CUmemLocation":                                         int64(unsafe.Sizeof(loc)),
		"offsetof CUmemLocation.type":                                  int64(unsafe.Offsetof(loc.Type)),
		"offsetof CUmemLocation.id":                                    int64(unsafe.Offsetof(loc.ID)),
		"sizeof CUmemAllocationProp":                                   int64(unsafe.Sizeof(prop)),
		"offsetof CUmemAllocationProp.type":                            int64(unsafe.Offsetof(prop.Type)),
		"offsetof CUmemAllocationProp.requestedHandleTypes":            int64(unsafe.Offsetof(prop.RequestedHandleTypes)),
		"offsetof CUmemAllocationProp.location":                        int64(unsafe.Offsetof(prop.Location)),
		"offsetof CUmemAllocationProp.win32HandleMetaData":             int64(unsafe.Offsetof(prop.Win32HandleMetaData)),
		"offsetof CUmemAllocationProp.allocFlags.compressionType":      int64(unsafe.Offsetof(prop.CompressionType)),
		"offsetof CUmemAllocationProp.allocFlags.gpuDirectRDMACapable": int64(unsafe.Offsetof(prop.GPUDirectRDMACapable)),
		"offsetof CUmemAllocationProp.allocFlags.usage":                int64(unsafe.Offsetof(prop.Usage)),
		"offsetof CUmemAllocationProp.allocFlags.reserved":             int64(unsafe.Offsetof(prop.Reserved)),
		"sizeof CUmemAccessDesc":                                       int64(unsafe.Sizeof(access)),
		"offsetof CUmemAccessDesc.location":                            int64(unsafe.Offsetof(access.Location)),
		"offsetof CUmemAccessDesc.flags":                               int64(unsafe.Offsetof(access.Flags)),
		"sizeof CUmemGenericAllocationHandle":                          int64(unsafe.Sizeof(handle)),
		"sizeof CUresult":                                              4, // every bound driver function returns int32
		"sizeof cudaError_t":                                           4, // and every runtime function
		"CU_MEM_ALLOCATION_TYPE_PINNED":                                memAllocationTypePinned,
		"CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR":                     memHandleTypePosixFD,
		"CU_MEM_LOCATION_TYPE_DEVICE":                                  memLocationTypeDevice,
		"CU_MEM_ACCESS_FLAGS_PROT_READWRITE":                           memAccessReadWrite,
		"CU_MEM_ALLOC_GRANULARITY_MINIMUM":                             memGranularityMinimum,
		"cudaStreamNonBlocking":                                        streamNonBlocking,
		"cudaEventBlockingSync":                                        eventBlockingSync,
		"cudaEventDisableTiming":                                       eventDisableTiming,
		"CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED":  attrGPUDirectRDMAWithVMM,
		"sizeof CUuuid":                                                int64(unsafe.Sizeof([16]byte{})), // cuDeviceGetUuid's out: *[16]byte
		"sizeof CUdevice":                                              4,                                // the driver's device handle: int32
		"cudaMemcpyHostToDevice":                                       memcpyHostToDevice,
		"cudaHostRegisterPortable":                                     hostRegisterPortable,
		"cudaErrorInsufficientDriver":                                  int64(ErrorInsufficientDriver),
		"cudaErrorNoDevice":                                            int64(ErrorNoDevice),
	}
	for code, name := range cuFileErrorNames {
		want["cufile error "+name] = int64(code)
	}
	if cuFileErrorNames[cuFileCUDADriverError] != "CU_FILE_CUDA_DRIVER_ERROR" {
		t.Errorf("cuFileCUDADriverError %d is not CU_FILE_CUDA_DRIVER_ERROR", cuFileCUDADriverError)
	}
	for name, w := range want {
		got, ok := c[name]
		switch {
		case !ok:
			t.Errorf("%s: the probe does not print it", name)
		case got != w:
			t.Errorf("%s: the header says %d, the Go mirror %d", name, got, w)
		}
	}
	for name := range c {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: printed by the probe but not compared", name)
		}
	}
}

// TestErrorNamesMatchHeader: every CUfileOpError cufile.h declares has
// its name here (a code cuFile returns is never shown as a bare number),
// and no name here is not cufile.h's.
func TestErrorNamesMatchHeader(t *testing.T) {
	dir := cudaWheels(t)
	h, err := os.ReadFile(filepath.Join(dir, "include", "cufile.h"))
	if err != nil {
		t.Fatal(err)
	}
	op := regexp.MustCompile(`CUFILE_OP\(\s*CUFILEOP_BASE_ERR\s*\+\s*(\d+),\s*(CU_FILE_\w+)`)
	want := map[int32]string{}
	for _, m := range op.FindAllStringSubmatch(string(h), -1) {
		n, _ := strconv.Atoi(m[1])
		want[int32(cuFileBaseErr+n)] = m[2]
	}
	if len(want) < 40 {
		t.Fatalf("cufile.h: %d CUfileOpError values read, want the whole list", len(want))
	}
	for code, name := range want {
		if got := (&FileError{Code: code}).Name(); got != name {
			t.Errorf("code %d: named %q, cufile.h says %s", code, got, name)
		}
	}
	for code, name := range cuFileErrorNames {
		if want[code] != name {
			t.Errorf("code %d: named %s here, cufile.h says %q", code, name, want[code])
		}
	}
}
