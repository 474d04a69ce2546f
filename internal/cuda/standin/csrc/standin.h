// SPDX-License-Identifier: Apache-2.0
//
// The CUDA stand-in's shared types and internal API. libcuda.so.1
// (cuda.c) holds ALL state: devices, contexts, memory, streams, events,
// the violations and the report; libcudart.so.13 (cudart.c) and
// libcufile.so.0 (cufile.c) link it and call the driver API and the
// standin_* functions declared here.
//
// The ABI types are defined here, not taken from NVIDIA's headers, so that
// the stand-in builds with no NVIDIA file present; their names, sizes,
// offsets and constants are those of cuda.h and cufile.h (CUDA 13.0,
// cuFile 1.15), which abi_test.go checks against the headers when they are
// installed.
#ifndef CUDA_STANDIN_H
#define CUDA_STANDIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

// ---- cuda.h ----

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

typedef struct CUuuid_st {
	char bytes[16];
} CUuuid;

typedef struct CUmemLocation_st {
	int type;
	int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
	CUmemLocation location;
	int flags;
} CUmemAccessDesc;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
	CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	CUDA_ERROR_NOT_PERMITTED = 800,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_UNKNOWN = 999,
};

enum {
	CU_MEM_ALLOCATION_TYPE_PINNED = 1,
	CU_MEM_HANDLE_TYPE_NONE = 0,
	CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
	CU_MEM_LOCATION_TYPE_DEVICE = 1,
	CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
	CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
	CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
	CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
	CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
	CU_STREAM_DEFAULT = 0,
	CU_STREAM_NON_BLOCKING = 1,
	CU_EVENT_DEFAULT = 0,
	CU_EVENT_BLOCKING_SYNC = 1,
	CU_EVENT_DISABLE_TIMING = 2,
	CU_EVENT_INTERPROCESS = 4,
	CU_MEMHOSTREGISTER_PORTABLE = 1,
	CU_MEMHOSTREGISTER_DEVICEMAP = 2,
	CU_MEMHOSTREGISTER_IOMEMORY = 4,
	CU_MEMHOSTREGISTER_READ_ONLY = 8,
	CU_GET_PROC_ADDRESS_SUCCESS = 0,
	CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
	CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
	CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
	CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
	CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
	CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
	CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
	CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
	CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
	CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
	CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
	CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 = 92,
	CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99,
	CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
	CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
	CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110,
	CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116,
	CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,
};

// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the default streams' handles.
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

// The driver API calls cudart.c and cufile.c use (cuda.c defines them,
// with the rest of the driver API the project binds).
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev);
CUresult cuDeviceGetPCIBusId(char *busid, int len, CUdevice dev);
CUresult cuDriverGetVersion(int *version);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuStreamCreate(CUstream *s, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream s);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags);
CUresult cuEventCreate(CUevent *e, unsigned int flags);
CUresult cuEventRecord(CUevent e, CUstream s);
CUresult cuEventQuery(CUevent e);
CUresult cuEventSynchronize(CUevent e);
CUresult cuEventDestroy_v2(CUevent e);
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, uint64_t flags, int *status);

// ---- cufile.h ----

enum {
	CUFILEOP_BASE_ERR = 5000,
	CU_FILE_SUCCESS = 0,
	CU_FILE_DRIVER_NOT_INITIALIZED = 5001,
	CU_FILE_DRIVER_CLOSING = 5006,
	CU_FILE_CUDA_DRIVER_ERROR = 5011,
	CU_FILE_CUDA_POINTER_INVALID = 5012,
	CU_FILE_CUDA_POINTER_RANGE_ERROR = 5014,
	CU_FILE_CUDA_CONTEXT_MISMATCH = 5015,
	CU_FILE_INVALID_FILE_TYPE = 5018,
	CU_FILE_INVALID_FILE_OPEN_FLAG = 5019,
	CU_FILE_INVALID_VALUE = 5022,
	CU_FILE_MEMORY_ALREADY_REGISTERED = 5023,
	CU_FILE_HANDLE_NOT_REGISTERED = 5027,
	CU_FILE_HANDLE_ALREADY_REGISTERED = 5028,
	CU_FILE_INTERNAL_BUF_REGISTER_ERROR = 5045,
	CU_FILE_INVALID_CONTEXT_ERROR = 5047,
	CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1,
	CU_FILE_RDMA_REGISTER = 1,
	CU_FILE_RDMA_RELAXED_ORDERING = 2,
	CUFILE_GPU_UUID_LEN = 16,
	CU_FILE_NVME_SUPPORTED = 4,    // a bit position of dstatusflags
	CU_FILE_ALLOW_COMPAT_MODE = 1, // a bit position of dcontrolflags
};

typedef struct CUfileError {
	int err;    // CUfileOpError
	CUresult cu_err;
} CUfileError_t;

typedef struct CUfileDescr_t {
	int type;
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
} CUfileDescr_t;

typedef void *CUfileHandle_t;

typedef struct CUfileDrvProps {
	struct {
		unsigned int major_version;
		unsigned int minor_version;
		size_t poll_thresh_size;
		size_t max_direct_io_size;
		unsigned int dstatusflags;
		unsigned int dcontrolflags;
	} nvfs;
	unsigned int fflags;
	unsigned int max_device_cache_size;
	unsigned int per_buffer_cache_size;
	unsigned int max_device_pinned_mem_size;
	unsigned int max_batch_io_size;
	unsigned int max_batch_io_timeout_msecs;
} CUfileDrvProps_t;

typedef struct CUfileOpCounter {
	uint64_t ok;
	uint64_t err;
} CUfileOpCounter_t;

// CUfileStatsLevel1_t's first fields (what the stand-in fills), padded
// to the header's 512 bytes.
typedef struct CUfileStatsLevel1 {
	CUfileOpCounter_t read_ops;
	CUfileOpCounter_t write_ops;
	CUfileOpCounter_t hdl_register_ops;
	CUfileOpCounter_t hdl_deregister_ops;
	CUfileOpCounter_t buf_register_ops;
	CUfileOpCounter_t buf_deregister_ops;
	uint64_t read_bytes;
	uint64_t rest[51];
} CUfileStatsLevel1_t;

typedef struct CUfileStatsLevel2 {
	CUfileStatsLevel1_t basic;
	uint64_t read_size_kb_hist[32];
	uint64_t write_size_kb_hist[32];
} CUfileStatsLevel2_t;

typedef struct CUfilePerGpuStats {
	char uuid[CUFILE_GPU_UUID_LEN];
	uint64_t read_bytes;
	uint64_t read_bw_bytes_per_sec;
	uint64_t read_utilization;
	uint64_t read_duration_us;
	uint64_t n_total_reads;
	uint64_t n_p2p_reads;
	uint64_t n_nvfs_reads;
	uint64_t n_posix_reads;
	uint64_t n_unaligned_reads;
	uint64_t n_dr_reads;
	uint64_t n_sparse_regions;
	uint64_t n_inline_regions;
	uint64_t n_reads_err;
	uint64_t write_fields[11]; // writes_bytes .. n_writes_err
	uint64_t n_mmap;
	uint64_t n_mmap_ok;
	uint64_t n_mmap_err;
	uint64_t n_mmap_free;
	uint64_t reg_bytes;
} CUfilePerGpuStats_t;

typedef struct CUfileStatsLevel3 {
	CUfileStatsLevel2_t detailed;
	uint32_t num_gpus;
	CUfilePerGpuStats_t per_gpu_stats[16];
} CUfileStatsLevel3_t;

_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc");
_Static_assert(sizeof(CUfileDescr_t) == 24, "CUfileDescr_t");
_Static_assert(sizeof(CUfileDrvProps_t) == 56, "CUfileDrvProps_t");
_Static_assert(sizeof(CUfileStatsLevel1_t) == 512, "CUfileStatsLevel1_t");
_Static_assert(sizeof(CUfilePerGpuStats_t) == 248, "CUfilePerGpuStats_t");
_Static_assert(sizeof(CUfileStatsLevel3_t) == 5000, "CUfileStatsLevel3_t");
_Static_assert(offsetof(CUfileStatsLevel3_t, num_gpus) == 1024, "num_gpus");
_Static_assert(offsetof(CUfileStatsLevel3_t, per_gpu_stats) == 1032, "per_gpu_stats");
_Static_assert(offsetof(CUfilePerGpuStats_t, n_total_reads) == 48, "n_total_reads");
_Static_assert(offsetof(CUfilePerGpuStats_t, n_mmap) == 208, "n_mmap");

// ---- the stand-in's internal API (exported by libcuda.so.1) ----

// Live counts: what is still allocated, mapped, registered or created.
enum standin_live {
	LIVE_ALLOCATIONS,         // cuMemCreate handles not released
	LIVE_IMPORTS,             // cuMemImportFromShareableHandle handles not released
	LIVE_RESERVATIONS,        // cuMemAddressReserve ranges not freed
	LIVE_MAPPINGS,            // cuMemMap mappings not unmapped
	LIVE_HANDLES,             // exported descriptors still open in this process
	LIVE_PRIMARY_CTX_RETAINS, // cuDevicePrimaryCtxRetain not released
	LIVE_HOST_REGISTRATIONS,  // cudaHostRegister / cuMemHostRegister not unregistered
	LIVE_STREAMS,
	LIVE_EVENTS,
	LIVE_CUFILE_HANDLES, // cuFileHandleRegister not deregistered
	LIVE_CUFILE_BUFFERS, // cuFileBufRegister not deregistered
	LIVE_N,
};

// Counters that are not leaks.
enum standin_stat {
	STAT_CUFILE_DRIVER_OPEN, // cuFileDriverOpen minus cuFileDriverClose
	STAT_COPIES,             // copies done (memcpy calls, stand-in kernels)
	STAT_CUFILE_READS,       // cuFileRead calls
	STAT_N,
};

// standin_violation records a broken precondition "<call>: <what>",
// prints it to stderr and rewrites the report; it returns code.
int standin_violation(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// standin_live_add and standin_stat_add change a count (the report is
// rewritten for live counts and the driver-open count).
void standin_live_add(enum standin_live which, long delta);
void standin_stat_add(enum standin_stat which, long delta);

// standin_initialized says whether cuInit has been called.
int standin_initialized(void);

// standin_context returns the physical GPU of the calling thread's
// current context, -1 when there is none, -2 when it was released.
int standin_context(void);

// standin_runtime_bind makes the primary context of the caller's
// ordinal the runtime's (held until exit, as cudart does) and returns it.
CUcontext standin_runtime_bind(int ordinal);

// standin_ordinal returns the caller's ordinal of physical GPU phys, or -1
// when CUDA_VISIBLE_DEVICES hides it; standin_phys the inverse.
int standin_ordinal(int phys);
int standin_phys(int ordinal);
int standin_visible_count(void);

// standin_uuid fills the 16 UUID bytes of physical GPU phys.
void standin_uuid(int phys, char out[16]);

// Device range checks. standin_pin checks that [p, p+n) is mapped device
// memory with the access asked for (write: read-write, else read) and marks
// it (how) until standin_unpin: PIN_IO for I/O in flight (cuMemUnmap waits
// for it, a violation), PIN_REGISTERED for a cuFile registration (cuMemUnmap
// before cuFileBufDeregister is a violation). It returns 0,
// STANDIN_NOT_MAPPED or STANDIN_NO_ACCESS, and the memory's physical GPU and
// whether it was created gpuDirectRDMACapable.
enum { STANDIN_NOT_MAPPED = 1, STANDIN_NO_ACCESS = 2 };
enum standin_pin_kind { PIN_IO, PIN_REGISTERED };
int standin_pin(uintptr_t p, size_t n, int write, enum standin_pin_kind how, int *phys, int *rdma);
void standin_unpin(uintptr_t p, size_t n, enum standin_pin_kind how);

// Handles: objects live in growable arrays and are never freed; a handle
// is the object's kind in bits 40 and up and its index + 1 below, so a
// stale or foreign handle is recognised without touching freed memory.
enum standin_kind { K_CTX = 0xc1, K_STREAM, K_EVENT, K_ALLOC, K_CUFILE };

struct standin_vec {
	void **p;
	size_t n, cap;
};

// standin_push appends x and returns its index.
static inline size_t standin_push(struct standin_vec *v, void *x) {
	if (v->n == v->cap) {
		v->cap = v->cap ? 2 * v->cap : 16;
		v->p = realloc(v->p, v->cap * sizeof *v->p);
		if (!v->p)
			abort();
	}
	v->p[v->n] = x;
	return v->n++;
}

static inline uint64_t standin_handle(enum standin_kind k, size_t i) { return (uint64_t)k << 40 | (i + 1); }

// standin_lookup returns the object of handle h of kind k, or NULL.
static inline void *standin_lookup(struct standin_vec *v, enum standin_kind k, uint64_t h) {
	size_t i = h & ((1ULL << 40) - 1);
	if (h >> 40 != (uint64_t)k || i == 0 || i > v->n)
		return NULL;
	return v->p[i - 1];
}

// standin_memcpy2d copies height rows of width bytes (pitches dpitch and
// spitch), kind as cudaMemcpyKind (0 host-host, 1 host-device, 2
// device-host, 3 device-device, 4 inferred), on stream s (NULL, legacy
// and per-thread run before returning). call names the caller in
// violations. Returns a CUresult.
CUresult standin_memcpy2d(const char *call, void *dst, size_t dpitch, const void *src, size_t spitch,
                          size_t width, size_t height, int kind, CUstream s);

// standin_rdma reads CUDA_STANDIN_RDMA (device attribute 110).
int standin_rdma(void);

#endif
