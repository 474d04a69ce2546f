// SPDX-License-Identifier: Apache-2.0
//
// libcudart.so.13 of the CUDA stand-in: the runtime API the project binds,
// implemented on the stand-in driver (libcuda.so.1, found next to this
// library: rpath $ORIGIN) as the real runtime is on the real driver. It
// keeps no state of its own but the calling thread's device.
//
// Rules (a violation returns the error named and is recorded in
// libcuda.so.1's report):
//   - No implicit context. cuda_runtime_api.h, cudaSetDevice: it "will bind
//     the primary context of the specified device to the calling thread";
//     without it the real runtime silently binds device 0's primary
//     context on first use ("\note_init_rt"). STRICTER: a call that needs a
//     context (streams, events, copies, host registration) on a thread
//     where cudaSetDevice was never called and no context is current is a
//     violation ("implicit context on device 0"), cudaErrorDeviceUninitialized.
//     Version, device count, attribute, PCI bus id, error string and entry
//     point queries need none.
//   - cudaSetDevice: "Valid device id's are 0 to (cudaGetDeviceCount() - 1)"
//     (cudaErrorInvalidDevice).
//   - cudaMemcpy2DAsync: a pitch smaller than the width is
//     cudaErrorInvalidPitchValue (cuda_runtime_api.h, cudaMemcpy2D).
//   - cudaMemsetAsync: the range is checked as a copy's destination; it is
//     a copy from zeroed host memory on the stream (the project only
//     zeroes), so a value other than 0 is refused, cudaErrorInvalidValue.
//   - The rest is the driver's (cuda.c): host registration overlap (712) and
//     unregister of what is not registered (713), copies to or from device
//     ranges not mapped and accessible, streams and events used after
//     destroy.
// Error codes: the driver's CUresult values used here equal the runtime's
// cudaError_t values (driver_types.h), so they pass through.
#define _GNU_SOURCE
#include "standin.h"

#include <stdio.h>
#include <string.h>

typedef int cudaError_t;
typedef CUstream cudaStream_t;
typedef CUevent cudaEvent_t;

enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorInvalidPitchValue = 12,
	cudaErrorInvalidDevice = 101,
	cudaErrorDeviceUninitialized = 201,
	cudaErrorSymbolNotFound = 500,
};

// The calling thread's device, set by cudaSetDevice; -1 when never set.
static __thread int rt_device = -1;

// rt_init initialises the driver as the real runtime does on first use.
static cudaError_t rt_init(void) { return standin_initialized() ? cudaSuccess : cuInit(0); }

// rt_enter checks the preconditions of a call that needs a context, and
// binds the runtime's device again when the thread's context was popped
// (as the runtime does).
static cudaError_t rt_enter(const char *call) {
	cudaError_t r = rt_init();
	if (r)
		return r;
	if (standin_context() != -1)
		return cudaSuccess;
	if (rt_device < 0)
		return standin_violation(cudaErrorDeviceUninitialized,
		                         "%s: implicit context on device 0 (cudaSetDevice was never called on this thread)",
		                         call);
	return cuCtxSetCurrent(standin_runtime_bind(rt_device));
}

static const struct {
	int code;
	const char *name, *msg;
} errors[] = {
    {0, "cudaSuccess", "no error"},
    {1, "cudaErrorInvalidValue", "invalid argument"},
    {2, "cudaErrorMemoryAllocation", "out of memory"},
    {3, "cudaErrorInitializationError", "initialization error"},
    {12, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {35, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
    {100, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {101, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {201, "cudaErrorDeviceUninitialized", "invalid device context"},
    {400, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {401, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {500, "cudaErrorSymbolNotFound", "named symbol not found"},
    {600, "cudaErrorNotReady", "device not ready"},
    {700, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {712, "cudaErrorHostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped"},
    {713, "cudaErrorHostMemoryNotRegistered", "pointer does not correspond to a registered memory region"},
    {800, "cudaErrorNotPermitted", "operation not permitted"},
    {801, "cudaErrorNotSupported", "operation not supported"},
    {999, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorName(cudaError_t code) {
	for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
		if (errors[i].code == code)
			return errors[i].name;
	return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t code) {
	for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
		if (errors[i].code == code)
			return errors[i].msg;
	return "unrecognized error code";
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

cudaError_t cudaDriverGetVersion(int *v) { return cuDriverGetVersion(v); }

cudaError_t cudaRuntimeGetVersion(int *v) {
	if (!v)
		return cudaErrorInvalidValue;
	*v = 13000;
	return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n) {
	cudaError_t r = rt_init();
	return r ? r : cuDeviceGetCount(n);
}

cudaError_t cudaSetDevice(int device) {
	cudaError_t r = rt_init();
	if (r)
		return r;
	CUcontext c = standin_runtime_bind(device);
	if (!c)
		return standin_violation(cudaErrorInvalidDevice, "cudaSetDevice: device %d does not exist (%d visible)",
		                         device, standin_visible_count());
	r = cuCtxSetCurrent(c);
	if (!r)
		rt_device = device;
	return r;
}

cudaError_t cudaGetDevice(int *device) {
	*device = rt_device < 0 ? 0 : rt_device;
	return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, int attr, int device) {
	cudaError_t r = rt_init();
	return r ? r : cuDeviceGetAttribute(v, attr, device);
}

cudaError_t cudaDeviceGetPCIBusId(char *busid, int len, int device) {
	cudaError_t r = rt_init();
	return r ? r : cuDeviceGetPCIBusId(busid, len, device);
}

cudaError_t cudaDeviceSynchronize(void) {
	cudaError_t r = rt_enter("cudaDeviceSynchronize");
	return r ? r : cuCtxSynchronize();
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags, int *status) {
	cudaError_t r = rt_init();
	if (r)
		return r;
	r = cuGetProcAddress_v2(symbol, fn, (int)version, flags, status);
	return r == CUDA_ERROR_NOT_FOUND ? cudaErrorSymbolNotFound : r;
}

cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags) {
	cudaError_t r = rt_enter("cudaHostRegister");
	return r ? r : cuMemHostRegister_v2(p, size, flags);
}

cudaError_t cudaHostUnregister(void *p) {
	cudaError_t r = rt_enter("cudaHostUnregister");
	return r ? r : cuMemHostUnregister(p);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
	cudaError_t r = rt_enter("cudaStreamCreateWithFlags");
	return r ? r : cuStreamCreate(s, flags);
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
	cudaError_t r = rt_enter("cudaStreamDestroy");
	return r ? r : cuStreamDestroy_v2(s);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
	cudaError_t r = rt_enter("cudaStreamSynchronize");
	return r ? r : cuStreamSynchronize(s);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
	cudaError_t r = rt_enter("cudaStreamWaitEvent");
	return r ? r : cuStreamWaitEvent(s, e, flags);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
	cudaError_t r = rt_enter("cudaEventCreateWithFlags");
	return r ? r : cuEventCreate(e, flags);
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
	cudaError_t r = rt_enter("cudaEventRecord");
	return r ? r : cuEventRecord(e, s);
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
	cudaError_t r = rt_enter("cudaEventQuery");
	return r ? r : cuEventQuery(e);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
	cudaError_t r = rt_enter("cudaEventSynchronize");
	return r ? r : cuEventSynchronize(e);
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
	cudaError_t r = rt_enter("cudaEventDestroy");
	return r ? r : cuEventDestroy_v2(e);
}

// copy checks the runtime's preconditions of a copy and hands it to the
// driver's copy engine.
static cudaError_t copy(const char *call, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t height, int kind, cudaStream_t s) {
	cudaError_t r = rt_enter(call);
	if (r)
		return r;
	if (width > dpitch || width > spitch)
		return standin_violation(cudaErrorInvalidPitchValue, "%s: width %zu is more than a pitch (%zu, %zu)", call,
		                         width, dpitch, spitch);
	return standin_memcpy2d(call, dst, dpitch, src, spitch, width, height, kind, s);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s) {
	return copy("cudaMemcpyAsync", dst, n, src, n, n, 1, kind, s);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
	return copy("cudaMemcpy", dst, n, src, n, n, 1, kind, NULL);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              int kind, cudaStream_t s) {
	return copy("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, s);
}

// zeros is what cudaMemsetAsync copies from: never written, so a copy
// still queued reads zeros.
static const char zeros[1 << 16];

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s) {
	if (value != 0) {
		cudaError_t r = rt_enter("cudaMemsetAsync");
		return r ? r : standin_violation(cudaErrorInvalidValue, "cudaMemsetAsync: value %d (the stand-in sets zeros only)", value);
	}
	for (size_t off = 0; off < n; off += sizeof zeros) {
		size_t k = n - off < sizeof zeros ? n - off : sizeof zeros;
		cudaError_t r = copy("cudaMemsetAsync", (char *)dst + off, k, zeros, k, k, 1, 1, s);
		if (r)
			return r;
	}
	return n ? cudaSuccess : rt_enter("cudaMemsetAsync");
}
