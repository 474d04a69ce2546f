// SPDX-License-Identifier: Apache-2.0

package standin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

// abiItems are the sizes, offsets and constants of standin.h that must equal
// NVIDIA's cuda.h and cufile.h.
var abiItems = []string{
	"sizeof(CUuuid)", "sizeof(CUresult)", "sizeof(CUdevice)", "sizeof(CUdeviceptr)", "sizeof(CUmemGenericAllocationHandle)",
	"sizeof(CUmemLocation)", "offsetof(CUmemLocation, type)", "offsetof(CUmemLocation, id)",
	"sizeof(CUmemAllocationProp)", "offsetof(CUmemAllocationProp, type)",
	"offsetof(CUmemAllocationProp, requestedHandleTypes)", "offsetof(CUmemAllocationProp, location)",
	"offsetof(CUmemAllocationProp, win32HandleMetaData)", "offsetof(CUmemAllocationProp, allocFlags.compressionType)",
	"offsetof(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable)", "offsetof(CUmemAllocationProp, allocFlags.usage)",
	"offsetof(CUmemAllocationProp, allocFlags.reserved)",
	"sizeof(CUmemAccessDesc)", "offsetof(CUmemAccessDesc, location)", "offsetof(CUmemAccessDesc, flags)",
	"sizeof(CUfileError_t)", "offsetof(CUfileError_t, err)", "offsetof(CUfileError_t, cu_err)",
	"sizeof(CUfileDescr_t)", "offsetof(CUfileDescr_t, type)", "offsetof(CUfileDescr_t, handle.fd)",
	"offsetof(CUfileDescr_t, fs_ops)", "sizeof(CUfileHandle_t)",
	"sizeof(CUfileDrvProps_t)", "offsetof(CUfileDrvProps_t, nvfs.major_version)",
	"offsetof(CUfileDrvProps_t, nvfs.minor_version)", "offsetof(CUfileDrvProps_t, nvfs.poll_thresh_size)",
	"offsetof(CUfileDrvProps_t, nvfs.max_direct_io_size)", "offsetof(CUfileDrvProps_t, nvfs.dstatusflags)",
	"offsetof(CUfileDrvProps_t, nvfs.dcontrolflags)", "offsetof(CUfileDrvProps_t, fflags)",
	"offsetof(CUfileDrvProps_t, max_device_cache_size)", "offsetof(CUfileDrvProps_t, per_buffer_cache_size)",
	"offsetof(CUfileDrvProps_t, max_device_pinned_mem_size)", "offsetof(CUfileDrvProps_t, max_batch_io_size)",
	"offsetof(CUfileDrvProps_t, max_batch_io_timeout_msecs)",
	"sizeof(CUfileOpCounter_t)", "sizeof(CUfileStatsLevel1_t)", "offsetof(CUfileStatsLevel1_t, read_ops)",
	"offsetof(CUfileStatsLevel1_t, write_ops)", "offsetof(CUfileStatsLevel1_t, hdl_register_ops)",
	"offsetof(CUfileStatsLevel1_t, hdl_deregister_ops)", "offsetof(CUfileStatsLevel1_t, buf_register_ops)",
	"offsetof(CUfileStatsLevel1_t, buf_deregister_ops)", "offsetof(CUfileStatsLevel1_t, read_bytes)",
	"sizeof(CUfileStatsLevel2_t)", "offsetof(CUfileStatsLevel2_t, read_size_kb_hist)",
	"sizeof(CUfilePerGpuStats_t)", "offsetof(CUfilePerGpuStats_t, uuid)", "offsetof(CUfilePerGpuStats_t, read_bytes)",
	"offsetof(CUfilePerGpuStats_t, n_total_reads)", "offsetof(CUfilePerGpuStats_t, n_p2p_reads)",
	"offsetof(CUfilePerGpuStats_t, n_nvfs_reads)", "offsetof(CUfilePerGpuStats_t, n_posix_reads)",
	"offsetof(CUfilePerGpuStats_t, n_reads_err)", "offsetof(CUfilePerGpuStats_t, n_mmap)",
	"offsetof(CUfilePerGpuStats_t, n_mmap_ok)", "offsetof(CUfilePerGpuStats_t, n_mmap_err)",
	"offsetof(CUfilePerGpuStats_t, n_mmap_free)", "offsetof(CUfilePerGpuStats_t, reg_bytes)",
	"sizeof(CUfileStatsLevel3_t)", "offsetof(CUfileStatsLevel3_t, num_gpus)", "offsetof(CUfileStatsLevel3_t, per_gpu_stats)",
	"CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_NOT_INITIALIZED",
	"CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_INVALID_DEVICE", "CUDA_ERROR_INVALID_CONTEXT", "CUDA_ERROR_INVALID_HANDLE",
	"CUDA_ERROR_ILLEGAL_STATE", "CUDA_ERROR_NOT_FOUND", "CUDA_ERROR_NOT_READY", "CUDA_ERROR_ILLEGAL_ADDRESS",
	"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "CUDA_ERROR_NOT_PERMITTED",
	"CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_UNKNOWN",
	"CU_MEM_ALLOCATION_TYPE_PINNED", "CU_MEM_HANDLE_TYPE_NONE", "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
	"CU_MEM_LOCATION_TYPE_DEVICE", "CU_MEM_ACCESS_FLAGS_PROT_NONE", "CU_MEM_ACCESS_FLAGS_PROT_READ",
	"CU_MEM_ACCESS_FLAGS_PROT_READWRITE", "CU_MEM_ALLOC_GRANULARITY_MINIMUM", "CU_MEM_ALLOC_GRANULARITY_RECOMMENDED",
	"CU_STREAM_DEFAULT", "CU_STREAM_NON_BLOCKING", "(long)CU_STREAM_LEGACY", "(long)CU_STREAM_PER_THREAD",
	"CU_EVENT_DEFAULT", "CU_EVENT_BLOCKING_SYNC", "CU_EVENT_DISABLE_TIMING", "CU_EVENT_INTERPROCESS",
	"CU_MEMHOSTREGISTER_PORTABLE", "CU_MEMHOSTREGISTER_DEVICEMAP", "CU_MEMHOSTREGISTER_IOMEMORY",
	"CU_MEMHOSTREGISTER_READ_ONLY", "CU_GET_PROC_ADDRESS_SUCCESS", "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND",
	"CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", "CU_DEVICE_ATTRIBUTE_PCI_BUS_ID", "CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID",
	"CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING", "CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID",
	"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR",
	"CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED", "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
	"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
	"CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED",
	"CUFILEOP_BASE_ERR", "CU_FILE_SUCCESS", "CU_FILE_DRIVER_NOT_INITIALIZED", "CU_FILE_DRIVER_CLOSING",
	"CU_FILE_CUDA_DRIVER_ERROR", "CU_FILE_CUDA_POINTER_INVALID", "CU_FILE_CUDA_POINTER_RANGE_ERROR",
	"CU_FILE_CUDA_CONTEXT_MISMATCH", "CU_FILE_INVALID_FILE_TYPE", "CU_FILE_INVALID_VALUE",
	"CU_FILE_MEMORY_ALREADY_REGISTERED", "CU_FILE_HANDLE_NOT_REGISTERED", "CU_FILE_HANDLE_ALREADY_REGISTERED",
	"CU_FILE_INTERNAL_BUF_REGISTER_ERROR", "CU_FILE_INVALID_CONTEXT_ERROR", "CU_FILE_HANDLE_TYPE_OPAQUE_FD",
	"CU_FILE_RDMA_REGISTER", "CU_FILE_RDMA_RELAXED_ORDERING", "CUFILE_GPU_UUID_LEN", "CU_FILE_NVME_SUPPORTED",
	"CU_FILE_ALLOW_COMPAT_MODE",
}

// nvidiaWheels returns the directory of NVIDIA's CUDA wheels' include/ and
// lib/ (make test installs them into .venv; NVFEED_CUDA_WHEELS overrides),
// or skips.
func nvidiaWheels(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("NVFEED_CUDA_WHEELS"); d != "" {
		return d
	}
	m, _ := filepath.Glob("../../../.venv/lib/python3*/site-packages/nvidia/cu13")
	for _, d := range m {
		if _, err := os.Stat(filepath.Join(d, "include", "cufile.h")); err == nil {
			return d
		}
	}
	testenv.SkipPrivileged(t, "NVIDIA's CUDA wheels are not installed (make test installs nvidia-cuda-runtime and nvidia-cufile into .venv)")
	return ""
}

// probe compiles a program printing every abiItem with the headers named
// by flags and returns its output.
func probe(t *testing.T, flags ...string) string {
	t.Helper()
	var src strings.Builder
	src.WriteString("#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n")
	for _, item := range abiItems {
		fmt.Fprintf(&src, "\tprintf(\"%%s %%ld\\n\", %q, (long)(%s));\n", item, item)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "probe.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "probe")
	args := append(append([]string{"-o", bin}, flags...), filepath.Join(dir, "probe.c"))
	if out, err := exec.Command(cc(), args...).CombinedOutput(); err != nil {
		t.Fatalf("compiling the probe with %v: %v\n%s", flags, err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestABIMatchesNVIDIAHeaders compiles one probe against standin.h and one
// against NVIDIA's cuda.h and cufile.h (the wheels make test installs in
// .venv; NVFEED_CUDA_WHEELS overrides) and compares every line.
func TestABIMatchesNVIDIAHeaders(t *testing.T) {
	wheels := nvidiaWheels(t)
	src, err := filepath.Abs("csrc")
	if err != nil {
		t.Fatal(err)
	}
	inc := filepath.Join(wheels, "include")
	ours := strings.Split(probe(t, "-include", filepath.Join(src, "standin.h")), "\n")
	theirs := strings.Split(probe(t, "-I", inc, "-include", "cuda.h", "-include", "cufile.h"), "\n")
	if len(ours) != len(theirs) {
		t.Fatalf("%d lines from standin.h, %d from NVIDIA's headers", len(ours), len(theirs))
	}
	for i := range ours {
		if ours[i] != theirs[i] {
			t.Errorf("standin.h says %q, NVIDIA's headers %q", ours[i], theirs[i])
		}
	}
}
