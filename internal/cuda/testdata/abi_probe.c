/* Prints the sizes, offsets and constants of the CUDA structs and enums
 * that internal/cuda mirrors, as "name value" lines, from NVIDIA's own
 * headers (abi_test.go compiles and runs it). */
#include <stddef.h>
#include <stdio.h>
#include <cuda.h>
#include <driver_types.h>

#define P(name, v) printf("%s %ld\n", name, (long)(v))
#define S(t) P("sizeof " #t, sizeof(t))
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
	P("cudaEventDisableTiming", cudaEventDisableTiming);
	P("cudaMemcpyHostToDevice", cudaMemcpyHostToDevice);
	P("cudaHostRegisterPortable", cudaHostRegisterPortable);
	P("cudaErrorInsufficientDriver", cudaErrorInsufficientDriver);
	P("cudaErrorNoDevice", cudaErrorNoDevice);
	return 0;
}
