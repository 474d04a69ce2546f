// SPDX-License-Identifier: Apache-2.0
/* Prints the sizes, offsets and constants of the CUDA structs and enums
 * that internal/cuda mirrors, as "name value" lines, from NVIDIA's own
 * headers (abi_test.go compiles and runs it). */
#include <stddef.h>
#include <stdio.h>
#include <cuda.h>
#include <driver_types.h>
#include <sys/types.h>
#include <cufile.h>

#define P(name, v) printf("%s %ld\n", name, (long)(v))
#define S(t) P("sizeof " #t, sizeof(t))
/* O's offsetof takes a member path (nvfs.major_version) */
#define O(t, f) P("offsetof " #t "." #f, offsetof(t, f))

int main(void) {
	S(CUmemLocation);
	O(CUmemLocation, type);
	O(CUmemLocation, id);
	S(CUmemAllocationProp);
	O(CUmemAllocationProp, type);
	O(CUmemAllocationProp, requestedHandleTypes);
	O(CUmemAllocationProp, location);
	O(CUmemAllocationProp, win32HandleMetaData);
	O(CUmemAllocationProp, allocFlags.compressionType);
	O(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable);
	O(CUmemAllocationProp, allocFlags.usage);
	O(CUmemAllocationProp, allocFlags.reserved);
	S(CUmemAccessDesc);
	O(CUmemAccessDesc, location);
	O(CUmemAccessDesc, flags);
	S(CUmemGenericAllocationHandle);
	S(CUresult);
	S(cudaError_t);
	P("CU_MEM_ALLOCATION_TYPE_PINNED", CU_MEM_ALLOCATION_TYPE_PINNED);
	P("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR", CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	P("CU_MEM_LOCATION_TYPE_DEVICE", CU_MEM_LOCATION_TYPE_DEVICE);
	P("CU_MEM_ACCESS_FLAGS_PROT_READWRITE", CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	P("CU_MEM_ALLOC_GRANULARITY_MINIMUM", CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	P("cudaStreamNonBlocking", cudaStreamNonBlocking);
	P("cudaEventBlockingSync", cudaEventBlockingSync);
	P("cudaEventDisableTiming", cudaEventDisableTiming);
	P("CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
	S(CUuuid);
	S(CUdevice);
	P("cudaMemcpyHostToDevice", cudaMemcpyHostToDevice);
	P("cudaHostRegisterPortable", cudaHostRegisterPortable);
	P("cudaErrorInsufficientDriver", cudaErrorInsufficientDriver);
	P("cudaErrorNoDevice", cudaErrorNoDevice);
	S(CUfileDescr_t);
	O(CUfileDescr_t, type);
	O(CUfileDescr_t, handle);
	O(CUfileDescr_t, fs_ops);
	S(CUfileError_t);
	O(CUfileError_t, err);
	O(CUfileError_t, cu_err);
	S(CUfileHandle_t);
	S(ssize_t);
	S(off_t);
	S(CUfileDrvProps_t);
	O(CUfileDrvProps_t, nvfs.major_version);
	O(CUfileDrvProps_t, nvfs.minor_version);
	O(CUfileDrvProps_t, nvfs.dstatusflags);
	O(CUfileDrvProps_t, nvfs.dcontrolflags);
	O(CUfileDrvProps_t, fflags);
	S(CUfileStatsLevel3_t);
	O(CUfileStatsLevel3_t, num_gpus);
	O(CUfileStatsLevel3_t, per_gpu_stats);
	S(CUfilePerGpuStats_t);
	O(CUfilePerGpuStats_t, uuid);
	P("CUFILE_GPU_UUID_LEN", CUFILE_GPU_UUID_LEN);
	O(CUfilePerGpuStats_t, n_total_reads);
	O(CUfilePerGpuStats_t, n_p2p_reads);
	O(CUfilePerGpuStats_t, n_nvfs_reads);
	O(CUfilePerGpuStats_t, n_posix_reads);
	P("per_gpu_stats count", sizeof(((CUfileStatsLevel3_t *)0)->per_gpu_stats) / sizeof(CUfilePerGpuStats_t));
	P("CU_FILE_HANDLE_TYPE_OPAQUE_FD", CU_FILE_HANDLE_TYPE_OPAQUE_FD);
	P("CUFILEOP_BASE_ERR", CUFILEOP_BASE_ERR);
	P("cufile error CU_FILE_DRIVER_NOT_INITIALIZED", CU_FILE_DRIVER_NOT_INITIALIZED);
	P("cufile error CU_FILE_DRIVER_INVALID_PROPS", CU_FILE_DRIVER_INVALID_PROPS);
	P("cufile error CU_FILE_DRIVER_UNSUPPORTED_LIMIT", CU_FILE_DRIVER_UNSUPPORTED_LIMIT);
	P("cufile error CU_FILE_DRIVER_VERSION_MISMATCH", CU_FILE_DRIVER_VERSION_MISMATCH);
	P("cufile error CU_FILE_DRIVER_VERSION_READ_ERROR", CU_FILE_DRIVER_VERSION_READ_ERROR);
	P("cufile error CU_FILE_DRIVER_CLOSING", CU_FILE_DRIVER_CLOSING);
	P("cufile error CU_FILE_PLATFORM_NOT_SUPPORTED", CU_FILE_PLATFORM_NOT_SUPPORTED);
	P("cufile error CU_FILE_IO_NOT_SUPPORTED", CU_FILE_IO_NOT_SUPPORTED);
	P("cufile error CU_FILE_DEVICE_NOT_SUPPORTED", CU_FILE_DEVICE_NOT_SUPPORTED);
	P("cufile error CU_FILE_NVFS_DRIVER_ERROR", CU_FILE_NVFS_DRIVER_ERROR);
	P("cufile error CU_FILE_CUDA_DRIVER_ERROR", CU_FILE_CUDA_DRIVER_ERROR);
	P("cufile error CU_FILE_CUDA_POINTER_INVALID", CU_FILE_CUDA_POINTER_INVALID);
	P("cufile error CU_FILE_CUDA_MEMORY_TYPE_INVALID", CU_FILE_CUDA_MEMORY_TYPE_INVALID);
	P("cufile error CU_FILE_CUDA_POINTER_RANGE_ERROR", CU_FILE_CUDA_POINTER_RANGE_ERROR);
	P("cufile error CU_FILE_CUDA_CONTEXT_MISMATCH", CU_FILE_CUDA_CONTEXT_MISMATCH);
	P("cufile error CU_FILE_INVALID_MAPPING_SIZE", CU_FILE_INVALID_MAPPING_SIZE);
	P("cufile error CU_FILE_INVALID_MAPPING_RANGE", CU_FILE_INVALID_MAPPING_RANGE);
	P("cufile error CU_FILE_INVALID_FILE_TYPE", CU_FILE_INVALID_FILE_TYPE);
	P("cufile error CU_FILE_INVALID_FILE_OPEN_FLAG", CU_FILE_INVALID_FILE_OPEN_FLAG);
	P("cufile error CU_FILE_DIO_NOT_SET", CU_FILE_DIO_NOT_SET);
	P("cufile error CU_FILE_INVALID_VALUE", CU_FILE_INVALID_VALUE);
	P("cufile error CU_FILE_MEMORY_ALREADY_REGISTERED", CU_FILE_MEMORY_ALREADY_REGISTERED);
	P("cufile error CU_FILE_MEMORY_NOT_REGISTERED", CU_FILE_MEMORY_NOT_REGISTERED);
	P("cufile error CU_FILE_PERMISSION_DENIED", CU_FILE_PERMISSION_DENIED);
	P("cufile error CU_FILE_DRIVER_ALREADY_OPEN", CU_FILE_DRIVER_ALREADY_OPEN);
	P("cufile error CU_FILE_HANDLE_NOT_REGISTERED", CU_FILE_HANDLE_NOT_REGISTERED);
	P("cufile error CU_FILE_HANDLE_ALREADY_REGISTERED", CU_FILE_HANDLE_ALREADY_REGISTERED);
	P("cufile error CU_FILE_DEVICE_NOT_FOUND", CU_FILE_DEVICE_NOT_FOUND);
	P("cufile error CU_FILE_INTERNAL_ERROR", CU_FILE_INTERNAL_ERROR);
	P("cufile error CU_FILE_GETNEWFD_FAILED", CU_FILE_GETNEWFD_FAILED);
	P("cufile error CU_FILE_NVFS_SETUP_ERROR", CU_FILE_NVFS_SETUP_ERROR);
	P("cufile error CU_FILE_IO_DISABLED", CU_FILE_IO_DISABLED);
	P("cufile error CU_FILE_BATCH_SUBMIT_FAILED", CU_FILE_BATCH_SUBMIT_FAILED);
	P("cufile error CU_FILE_GPU_MEMORY_PINNING_FAILED", CU_FILE_GPU_MEMORY_PINNING_FAILED);
	P("cufile error CU_FILE_BATCH_FULL", CU_FILE_BATCH_FULL);
	P("cufile error CU_FILE_ASYNC_NOT_SUPPORTED", CU_FILE_ASYNC_NOT_SUPPORTED);
	P("cufile error CU_FILE_INTERNAL_BATCH_SETUP_ERROR", CU_FILE_INTERNAL_BATCH_SETUP_ERROR);
	P("cufile error CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR", CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR);
	P("cufile error CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR", CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR);
	P("cufile error CU_FILE_INTERNAL_BATCH_CANCEL_ERROR", CU_FILE_INTERNAL_BATCH_CANCEL_ERROR);
	P("cufile error CU_FILE_NOMEM_ERROR", CU_FILE_NOMEM_ERROR);
	P("cufile error CU_FILE_IO_ERROR", CU_FILE_IO_ERROR);
	P("cufile error CU_FILE_INTERNAL_BUF_REGISTER_ERROR", CU_FILE_INTERNAL_BUF_REGISTER_ERROR);
	P("cufile error CU_FILE_HASH_OPR_ERROR", CU_FILE_HASH_OPR_ERROR);
	P("cufile error CU_FILE_INVALID_CONTEXT_ERROR", CU_FILE_INVALID_CONTEXT_ERROR);
	P("cufile error CU_FILE_NVFS_INTERNAL_DRIVER_ERROR", CU_FILE_NVFS_INTERNAL_DRIVER_ERROR);
	P("cufile error CU_FILE_BATCH_NOCOMPAT_ERROR", CU_FILE_BATCH_NOCOMPAT_ERROR);
	P("cufile error CU_FILE_IO_MAX_ERROR", CU_FILE_IO_MAX_ERROR);
	return 0;
}
