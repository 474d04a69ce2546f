// SPDX-License-Identifier: Apache-2.0
//
// libcuda.so.1 of the CUDA stand-in: the driver API the project calls,
// over host memory, and ALL of the stand-in's state (libcudart.so.13 and
// libcufile.so.0 call in through standin.h).
//
// Model: CUDA_STANDIN_GPUS physical GPUs (default 2), seen through
// CUDA_VISIBLE_DEVICES as CUDA does. Device memory is a memfd per
// cuMemCreate (its name carries the GPU, the handle types and the RDMA
// flag, so an importing process learns them); an address reservation is a
// PROT_NONE anonymous mapping; cuMemMap maps the memfd over it, still
// PROT_NONE, until cuMemSetAccess opens it (a touch before that faults);
// an exported handle is a new descriptor of the memfd. A stream is a FIFO
// worker thread; an event is a marker in it.
//
// Strictness: a broken precondition returns the error named and records a
// violation "<call>: <what>" (printed as "cuda-standin: VIOLATION: ...",
// kept in the report). The rules and where NVIDIA states them (cuda.h of
// CUDA 13.0 unless said):
//   - cuInit first. cuInit: "must be called before any other function from
//     the driver API ... If cuInit() has not been called, any function from
//     the driver API will return CUDA_ERROR_NOT_INITIALIZED".
//   - A current context on the calling thread for every cuMem*, cuStream*,
//     cuEvent* call and cuCtxSynchronize: CUDA_ERROR_INVALID_CONTEXT "most
//     frequently indicates that there is no context bound to the current
//     thread"; the VMM sample (cuda-samples memMapIPCDrv) makes a context
//     current first. STRICTER: the real driver lets some VMM calls run
//     without one; here every such call needs it, and the context must be a
//     retained primary context (a released one is CUDA_ERROR_INVALID_CONTEXT).
//   - Sizes, addresses and offsets multiples of the granularity (2 MiB):
//     cuMemCreate ("size ... must be a multiple of ... the
//     CU_MEM_ALLOC_GRANULARITY_MINIMUM flag"), cuMemMap ("ptr, size, and
//     offset must be a multiple of ..."; offset "currently must be zero").
//     STRICTER: cuMemAddressReserve asks only for the host page size.
//   - Access before use: cuMemMap "does not make the address accessible,
//     the caller needs to ... cuMemSetAccess"; cuMemUnmap "all mappings
//     start with no accessibility setup". The mapping is PROT_NONE until
//     then, so a touch faults; copies into it are violations.
//   - cuMemSetAccess: "The range must be a fully mapped address range";
//     STRICTER: the location must be the memory's own GPU (in the caller's
//     ordinals), since the stand-in has no peer access.
//   - Export only of a handle type requested at creation:
//     CUmemAllocationProp.requestedHandleTypes, cuMemExportToShareableHandle.
//   - Use after release: cuMemRelease "If handle is not a valid handle the
//     behavior is undefined": here CUDA_ERROR_INVALID_VALUE; the same for a
//     double release. Streams and events used after destroy:
//     CUDA_ERROR_INVALID_HANDLE ("a resource handle passed to the API call
//     was not valid").
//   - cuMemMap "can only create mappings on VA range reservations that are
//     not currently mapped"; cuMemUnmap "The range must be the entire
//     contiguous address range that was mapped"; cuMemAddressFree "The size
//     must match what was given to memAddressReserve". STRICTER: freeing a
//     reservation that still has mappings is a violation.
//   - cuDevicePrimaryCtxRelease: "Releasing a primary context that has not
//     been previously retained will fail with CUDA_ERROR_INVALID_CONTEXT".
//   - cuEventRecord on the legacy default stream (NULL, CU_STREAM_LEGACY)
//     completes after the work queued before it on every blocking stream
//     of the context (the runtime API's "Stream synchronization
//     behavior"); non-blocking streams are not waited for. Other work on a
//     default stream runs at once, as before.
//   - cuEventRecord: "hEvent and hStream must be from the same context";
//     cuEventCreate: CU_EVENT_INTERPROCESS "CU_EVENT_DISABLE_TIMING must be
//     set".
//   - Host registration: cudaHostRegister / cuMemHostRegister (error 712 for
//     a range already registered, 713 to unregister what is not; a
//     read-only mapping needs CU_MEMHOSTREGISTER_READ_ONLY).
//   - Copies: device ranges must be mapped and accessible (read for a
//     source, read-write for a destination) when the copy is enqueued AND
//     when it runs. STRICTER: asynchronous copies always run later, on the
//     stream's thread, even from pageable memory; unmapping memory an
//     in-flight copy or cuFileRead uses is a violation (it waits for it).
// Counts of what is still allocated, mapped or registered are kept in the
// report (CUDA_STANDIN_REPORT=DIR: DIR/<pid>.json, written when the library
// loads and rewritten, tmp + rename, on every change of a live count and
// every violation: a Go process exits without running C destructors),
// with context_synchronizes: the cuCtxSynchronize calls (cudaDeviceSynchronize
// included), each a wait for the whole context.
//
// Test hooks (exported, not NVIDIA's):
//   CUresult cuStandinLaunchRead(CUstream s, CUdeviceptr src, size_t n,
//                                unsigned delay_us, void *host_dst)
//     a "kernel" of the consumer: sleeps delay_us on stream s, then copies n
//     device bytes at src to host_dst.
//   size_t cuStandinReport(char *buf, size_t len)
//     the report now (NUL-terminated, cut to len) into buf; rewrites the
//     report file; returns the report's length.
#define _GNU_SOURCE
#include "standin.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { GRAN = 2 << 20, MAX_GPUS = 16, MAX_STACK = 16, MAX_VIOLATIONS = 256 };

// ---- state

struct alloc {
	int live; // the handle is not released
	int imported;
	int fd; // the memfd, closed when no handle and no mapping use it
	size_t size;
	int phys, types, rdma;
	int maps;
};

struct resv {
	int live;
	uintptr_t base;
	size_t size;
};

struct mapping {
	int live;
	uintptr_t ptr;
	size_t size;
	struct alloc *a;
	int access; // CU_MEM_ACCESS_FLAGS_PROT_*
	int pins;   // copies and cuFileReads using it now
	int regs;   // cuFileBufRegister registrations in it
};

struct exported {
	int open;
	int fd;
	dev_t dev;
	ino_t ino;
};

struct hostreg {
	int live;
	uintptr_t base;
	size_t size;
};

struct op;

struct stream {
	int live, running, phys;
	unsigned flags;
	struct op *head, *tail;
	unsigned long enq, done;
	pthread_cond_t cond;
};

struct event {
	int live, phys, spun;
	unsigned flags;
	unsigned long recorded, done;
};

static struct {
	pthread_mutex_t mu;
	pthread_cond_t progress; // a stream finished an operation
	int initialized;
	int ngpus, nvisible, visible[MAX_GPUS], rdma;
	char report_dir[2048], exe[2048];
	struct {
		int retains, runtime, created;
	} ctx[MAX_GPUS];
	struct standin_vec hostallocs, ctxallocs;
	unsigned long ctx_ids; // contexts cuCtxCreate made
	struct standin_vec allocs, resvs, maps, exports, hostregs, streams, events;
	long live[LIVE_N], stat[STAT_N], runtime_contexts, spinning_events;
	long ctx_syncs; // cuCtxSynchronize calls (cudaDeviceSynchronize's too): whole-context waits
	char *violations[MAX_VIOLATIONS];
	long nviolations;
} st = {.mu = PTHREAD_MUTEX_INITIALIZER, .progress = PTHREAD_COND_INITIALIZER};

static const char *live_names[LIVE_N] = {
    "allocations", "imports", "reservations", "mappings", "handles", "primary_ctx_retains",
    "host_registrations", "streams", "events", "cufile_handles", "cufile_buffers",
};

// The calling thread's context stack: physical GPU + 1 per entry.
static __thread int tls_ctx[MAX_STACK];
static __thread int tls_depth;
// tls_made[i]: the id of the context of cuCtxCreate at tls_ctx[i], 0 for
// a primary context.
static __thread unsigned long tls_made[MAX_STACK];

static void lock(void) { pthread_mutex_lock(&st.mu); }
static void unlock(void) { pthread_mutex_unlock(&st.mu); }

// ---- GPUs

void standin_uuid(int phys, char out[16]) {
	memcpy(out, "STANDIN-GPU-000", 15);
	out[15] = "0123456789abcdef"[phys & 15];
}

static void uuid_string(int phys, char s[48]) {
	unsigned char u[16];
	standin_uuid(phys, (char *)u);
	snprintf(s, 48, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
	         u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

// parse_visible reads CUDA_VISIBLE_DEVICES as CUDA does: indices or GPU-
// UUID prefixes, the list ending at the first entry naming no GPU (or one
// already listed); unset shows every GPU, empty none.
static void parse_visible(const char *v) {
	st.nvisible = 0;
	if (!v) {
		for (int i = 0; i < st.ngpus; i++)
			st.visible[st.nvisible++] = i;
		return;
	}
	char buf[1024], *save = NULL;
	snprintf(buf, sizeof buf, "%s", v);
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		size_t n = strlen(tok);
		while (n && tok[n - 1] == ' ')
			tok[--n] = 0;
		int phys = -1;
		if (n && strspn(tok, "0123456789") == n) {
			phys = atoi(tok);
			if (phys >= st.ngpus)
				return;
		} else if (strncmp(tok, "GPU-", 4) == 0) {
			for (int i = 0; i < st.ngpus; i++) {
				char u[48];
				uuid_string(i, u);
				if (strncmp(u, tok, n) == 0) {
					if (phys >= 0)
						return; // ambiguous
					phys = i;
				}
			}
		}
		if (phys < 0)
			return;
		for (int i = 0; i < st.nvisible; i++)
			if (st.visible[i] == phys)
				return;
		st.visible[st.nvisible++] = phys;
	}
}

static void report_locked(void);

static int env_int(const char *name, int def) {
	const char *s = getenv(name);
	return s && *s ? atoi(s) : def;
}

__attribute__((constructor)) static void setup(void) {
	st.ngpus = env_int("CUDA_STANDIN_GPUS", 2);
	if (st.ngpus < 0)
		st.ngpus = 0;
	if (st.ngpus > MAX_GPUS)
		st.ngpus = MAX_GPUS;
	st.rdma = env_int("CUDA_STANDIN_RDMA", 1);
	const char *r = getenv("CUDA_STANDIN_REPORT");
	snprintf(st.report_dir, sizeof st.report_dir, "%s", r ? r : "");
	ssize_t n = readlink("/proc/self/exe", st.exe, sizeof st.exe - 1);
	st.exe[n > 0 ? n : 0] = 0;
	parse_visible(getenv("CUDA_VISIBLE_DEVICES"));
	report_locked(); // a report from the start: the stand-in is loaded
}

int standin_ordinal(int phys) {
	for (int i = 0; i < st.nvisible; i++)
		if (st.visible[i] == phys)
			return i;
	return -1;
}

int standin_phys(int ordinal) { return ordinal >= 0 && ordinal < st.nvisible ? st.visible[ordinal] : -1; }

int standin_visible_count(void) { return st.nvisible; }

int standin_rdma(void) { return st.rdma; }

// ---- the report

static void json_string(FILE *f, const char *s) {
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

// refresh_exports drops exported descriptors this process has closed since
// (checked by identity: a reused number names another file).
static void refresh_exports(void) {
	for (size_t i = 0; i < st.exports.n; i++) {
		struct exported *e = st.exports.p[i];
		struct stat s;
		if (e->open && (fstat(e->fd, &s) != 0 || s.st_dev != e->dev || s.st_ino != e->ino)) {
			e->open = 0;
			st.live[LIVE_HANDLES]--;
		}
	}
}

static char *report_json(size_t *len) {
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len);
	if (!f)
		return NULL;
	fprintf(f, "{\"pid\":%d,\"exe\":", (int)getpid());
	json_string(f, st.exe);
	fputs(",\"live\":{", f);
	for (int i = 0; i < LIVE_N; i++)
		fprintf(f, "%s\"%s\":%ld", i ? "," : "", live_names[i], st.live[i]);
	fprintf(f, "},\"cufile_driver_open\":%ld,\"runtime_contexts\":%ld,\"violations\":[",
	        st.stat[STAT_CUFILE_DRIVER_OPEN], st.runtime_contexts);
	long kept = st.nviolations < MAX_VIOLATIONS ? st.nviolations : MAX_VIOLATIONS;
	for (long i = 0; i < kept; i++) {
		if (i)
			fputc(',', f);
		json_string(f, st.violations[i]);
	}
	if (st.nviolations > kept)
		fprintf(f, ",\"cuda-standin: %ld more violations not kept\"", st.nviolations - kept);
	fprintf(f, "],\"spinning_events\":%ld,\"copies\":%ld,\"cufile_reads\":%ld,\"context_synchronizes\":%ld}\n",
	        st.spinning_events, st.stat[STAT_COPIES], st.stat[STAT_CUFILE_READS], st.ctx_syncs);
	fclose(f);
	return buf;
}

// report_locked rewrites DIR/<pid>.json (tmp + rename) when
// CUDA_STANDIN_REPORT is set.
static void report_locked(void) {
	refresh_exports();
	if (!st.report_dir[0])
		return;
	size_t len;
	char *json = report_json(&len);
	if (!json)
		return;
	char path[2200], tmp[2300];
	snprintf(path, sizeof path, "%s/%d.json", st.report_dir, (int)getpid());
	snprintf(tmp, sizeof tmp, "%s/.%d.json.tmp", st.report_dir, (int)getpid());
	mkdir(st.report_dir, 0755); // when missing (its parent must exist)
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd >= 0) {
		ssize_t w = write(fd, json, len);
		close(fd);
		if (w == (ssize_t)len)
			rename(tmp, path);
	}
	free(json);
}

__attribute__((destructor)) static void final_report(void) {
	if (pthread_mutex_trylock(&st.mu) == 0) { // never hang an exit
		report_locked();
		unlock();
	}
}

// cuStandinReport (a test hook) copies the current report, NUL-terminated
// and cut to len, into buf, rewrites the report file, and returns the
// report's full length.
size_t cuStandinReport(char *buf, size_t len) {
	lock();
	report_locked();
	size_t n = 0;
	char *json = report_json(&n);
	if (json && buf && len) {
		size_t c = n < len - 1 ? n : len - 1;
		memcpy(buf, json, c);
		buf[c] = 0;
	}
	free(json);
	unlock();
	return n;
}

static int vviolate_locked(int code, const char *fmt, va_list ap) {
	char *msg = NULL;
	if (vasprintf(&msg, fmt, ap) < 0)
		msg = NULL;
	fprintf(stderr, "cuda-standin: VIOLATION: %s\n", msg ? msg : fmt);
	if (st.nviolations < MAX_VIOLATIONS && msg)
		st.violations[st.nviolations] = msg;
	else
		free(msg);
	st.nviolations++;
	report_locked();
	return code;
}

static int violate(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int violate(int code, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vviolate_locked(code, fmt, ap);
	va_end(ap);
	return code;
}

int standin_violation(int code, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	lock();
	vviolate_locked(code, fmt, ap);
	unlock();
	va_end(ap);
	return code;
}

static void live_add_locked(enum standin_live which, long delta) {
	st.live[which] += delta;
	report_locked();
}

void standin_live_add(enum standin_live which, long delta) {
	lock();
	live_add_locked(which, delta);
	unlock();
}

void standin_stat_add(enum standin_stat which, long delta) {
	lock();
	st.stat[which] += delta;
	if (which == STAT_CUFILE_DRIVER_OPEN)
		report_locked();
	unlock();
}

// ---- the calling thread's context

static int cur_phys(void) { return tls_depth ? tls_ctx[tls_depth - 1] - 1 : -1; }

static int ctx_active(int phys) { return st.ctx[phys].retains > 0 || st.ctx[phys].runtime || st.ctx[phys].created > 0; }

int standin_initialized(void) {
	lock();
	int r = st.initialized;
	unlock();
	return r;
}

int standin_context(void) {
	lock();
	int p = cur_phys();
	if (p >= 0 && !ctx_active(p))
		p = -2;
	unlock();
	return p;
}

// enter checks a driver call's preconditions (mu held): cuInit called and,
// with need_ctx, a current context that is still retained.
static CUresult enter(const char *call, int need_ctx) {
	if (!st.initialized)
		return violate(CUDA_ERROR_NOT_INITIALIZED, "%s: cuInit has not been called", call);
	if (!need_ctx)
		return CUDA_SUCCESS;
	int p = cur_phys();
	if (p < 0)
		return violate(CUDA_ERROR_INVALID_CONTEXT, "%s: no current context on the calling thread", call);
	if (!ctx_active(p))
		return violate(CUDA_ERROR_INVALID_CONTEXT,
		               "%s: the current context (GPU %d's primary) is no longer retained", call, p);
	return CUDA_SUCCESS;
}

// device_phys checks a CUdevice (an ordinal) and returns its physical GPU.
static CUresult device_phys(const char *call, CUdevice dev, int *phys) {
	if (dev < 0 || dev >= st.nvisible)
		return violate(CUDA_ERROR_INVALID_DEVICE, "%s: device %d does not exist (%d visible)", call, dev,
		               st.nvisible);
	*phys = st.visible[dev];
	return CUDA_SUCCESS;
}

static CUcontext ctx_handle(int phys) { return (CUcontext)(uintptr_t)standin_handle(K_CTX, phys); }

// ctx_phys checks a CUcontext and returns its physical GPU.
static CUresult ctx_phys(const char *call, CUcontext c, int *phys) {
	uint64_t h = (uintptr_t)c, i = h & ((1ULL << 40) - 1);
	if (h >> 40 != K_CTX || i == 0 || (int)i > st.ngpus || standin_ordinal((int)i - 1) < 0)
		return violate(CUDA_ERROR_INVALID_CONTEXT, "%s: %p is not a context", call, (void *)c);
	*phys = (int)i - 1;
	if (!ctx_active(*phys))
		return violate(CUDA_ERROR_INVALID_CONTEXT, "%s: GPU %d's primary context is not retained", call, *phys);
	return CUDA_SUCCESS;
}

CUcontext standin_runtime_bind(int ordinal) {
	lock();
	int phys = standin_phys(ordinal);
	CUcontext c = NULL;
	if (phys >= 0) {
		if (!st.ctx[phys].runtime) {
			st.ctx[phys].runtime = 1;
			st.runtime_contexts++;
			report_locked();
		}
		c = ctx_handle(phys);
	}
	unlock();
	return c;
}

// ---- errors

static const struct {
	int code;
	const char *name, *msg;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUresult cuGetErrorName(CUresult code, const char **s) {
	for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
		if (errors[i].code == code) {
			*s = errors[i].name;
			return CUDA_SUCCESS;
		}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult code, const char **s) {
	for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
		if (errors[i].code == code) {
			*s = errors[i].msg;
			return CUDA_SUCCESS;
		}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

// ---- initialisation, versions, devices

CUresult cuInit(unsigned int flags) {
	lock();
	CUresult r = CUDA_SUCCESS;
	if (flags != 0)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuInit: flags %u (must be 0)", flags);
	else if (st.nvisible == 0)
		r = CUDA_ERROR_NO_DEVICE;
	else
		st.initialized = 1;
	unlock();
	return r;
}

CUresult cuDriverGetVersion(int *v) {
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = 13000;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
	lock();
	CUresult r = enter("cuDeviceGetCount", 0);
	if (!r)
		*n = st.nvisible;
	unlock();
	return r;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
	lock();
	int phys;
	CUresult r = enter("cuDeviceGet", 0);
	if (!r)
		r = device_phys("cuDeviceGet", ordinal, &phys);
	if (!r)
		*dev = ordinal;
	unlock();
	return r;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
	lock();
	int phys;
	CUresult r = enter("cuDeviceGetName", 0);
	if (!r)
		r = device_phys("cuDeviceGetName", dev, &phys);
	if (!r && len > 0)
		snprintf(name, len, "CUDA Stand-in GPU %d", phys);
	unlock();
	return r;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
	lock();
	int phys;
	CUresult r = enter("cuDeviceTotalMem", 0);
	if (!r)
		r = device_phys("cuDeviceTotalMem", dev, &phys);
	if (!r)
		*bytes = (size_t)80 << 30;
	unlock();
	return r;
}

static CUresult get_uuid(const char *call, CUuuid *u, CUdevice dev) {
	lock();
	int phys;
	CUresult r = enter(call, 0);
	if (!r)
		r = device_phys(call, dev, &phys);
	if (!r)
		standin_uuid(phys, u->bytes);
	unlock();
	return r;
}

CUresult cuDeviceGetUuid(CUuuid *u, CUdevice dev) { return get_uuid("cuDeviceGetUuid", u, dev); }
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice dev) { return get_uuid("cuDeviceGetUuid_v2", u, dev); }

CUresult cuDeviceGetPCIBusId(char *busid, int len, CUdevice dev) {
	lock();
	int phys;
	CUresult r = enter("cuDeviceGetPCIBusId", 0);
	if (!r)
		r = device_phys("cuDeviceGetPCIBusId", dev, &phys);
	if (!r && (!busid || len < 13))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetPCIBusId: a buffer of %d bytes (13 needed)", len);
	if (!r)
		snprintf(busid, len, "0000:%02x:00.0", 0x10 + phys);
	unlock();
	return r;
}

CUresult cuDeviceGetAttribute(int *v, int attrib, CUdevice dev) {
	lock();
	int phys;
	CUresult r = enter("cuDeviceGetAttribute", 0);
	if (!r)
		r = device_phys("cuDeviceGetAttribute", dev, &phys);
	if (!r) {
		switch (attrib) {
		case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
		case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = 0x10 + phys; break;
		case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
		case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
		case CU_DEVICE_ATTRIBUTE_INTEGRATED:
		case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: // CU_COMPUTEMODE_DEFAULT
		case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
		case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1: *v = 0; break; // no cuStreamWaitValue32 here
		case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
		case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
		case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
		case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
		case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
		case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
		case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
		case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: *v = 1; break;
		case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: *v = st.rdma; break;
		default:
			r = violate(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute: attribute %d is not modelled by the stand-in",
			            attrib);
		}
	}
	unlock();
	return r;
}

// ---- contexts

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
	lock();
	int phys;
	CUresult r = enter("cuDevicePrimaryCtxRetain", 0);
	if (!r)
		r = device_phys("cuDevicePrimaryCtxRetain", dev, &phys);
	if (!r) {
		st.ctx[phys].retains++;
		*ctx = ctx_handle(phys);
		live_add_locked(LIVE_PRIMARY_CTX_RETAINS, 1);
	}
	unlock();
	return r;
}

static CUresult primary_release(const char *call, CUdevice dev) {
	lock();
	int phys;
	CUresult r = enter(call, 0);
	if (!r)
		r = device_phys(call, dev, &phys);
	if (!r && st.ctx[phys].retains == 0)
		r = violate(CUDA_ERROR_INVALID_CONTEXT, "%s: device %d's primary context is not retained", call, dev);
	if (!r) {
		st.ctx[phys].retains--;
		live_add_locked(LIVE_PRIMARY_CTX_RETAINS, -1);
	}
	unlock();
	return r;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_release("cuDevicePrimaryCtxRelease", dev); }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release("cuDevicePrimaryCtxRelease_v2", dev); }

static CUresult ctx_push(const char *call, CUcontext c) {
	lock();
	int phys;
	CUresult r = enter(call, 0);
	if (!r)
		r = ctx_phys(call, c, &phys);
	if (!r && tls_depth == MAX_STACK)
		r = violate(CUDA_ERROR_INVALID_VALUE, "%s: context stack deeper than %d (pushes without pops)", call,
		            MAX_STACK);
	if (!r) {
		tls_made[tls_depth] = 0;
		tls_ctx[tls_depth++] = phys + 1;
	}
	unlock();
	return r;
}

CUresult cuCtxPushCurrent(CUcontext c) { return ctx_push("cuCtxPushCurrent", c); }
CUresult cuCtxPushCurrent_v2(CUcontext c) { return ctx_push("cuCtxPushCurrent_v2", c); }

static CUresult ctx_pop(const char *call, CUcontext *c) {
	lock();
	CUresult r = enter(call, 0);
	if (!r && tls_depth == 0)
		r = violate(CUDA_ERROR_INVALID_CONTEXT, "%s: no context on the calling thread to pop", call);
	if (!r) {
		int phys = tls_ctx[--tls_depth] - 1;
		if (c)
			*c = ctx_handle(phys);
	}
	unlock();
	return r;
}

CUresult cuCtxPopCurrent(CUcontext *c) { return ctx_pop("cuCtxPopCurrent", c); }
CUresult cuCtxPopCurrent_v2(CUcontext *c) { return ctx_pop("cuCtxPopCurrent_v2", c); }

CUresult cuCtxSetCurrent(CUcontext c) {
	lock();
	int phys;
	CUresult r = enter("cuCtxSetCurrent", 0);
	if (!r && !c) {
		if (tls_depth)
			tls_depth--;
	} else if (!r && !(r = ctx_phys("cuCtxSetCurrent", c, &phys))) {
		if (!tls_depth)
			tls_depth = 1;
		tls_ctx[tls_depth - 1] = phys + 1;
		tls_made[tls_depth - 1] = 0;
	}
	unlock();
	return r;
}

CUresult cuCtxGetCurrent(CUcontext *c) {
	lock();
	CUresult r = enter("cuCtxGetCurrent", 0);
	if (!r)
		*c = tls_depth ? ctx_handle(cur_phys()) : NULL;
	unlock();
	return r;
}

CUresult cuCtxGetDevice(CUdevice *dev) {
	lock();
	CUresult r = enter("cuCtxGetDevice", 1);
	if (!r)
		*dev = standin_ordinal(cur_phys());
	unlock();
	return r;
}

// ---- device memory

static struct mapping *mapping_at(uintptr_t p) {
	for (size_t i = 0; i < st.maps.n; i++) {
		struct mapping *m = st.maps.p[i];
		if (m->live && p >= m->ptr && p - m->ptr < m->size)
			return m;
	}
	return NULL;
}

static struct resv *resv_at(uintptr_t p) {
	for (size_t i = 0; i < st.resvs.n; i++) {
		struct resv *v = st.resvs.p[i];
		if (v->live && p >= v->base && p - v->base < v->size)
			return v;
	}
	return NULL;
}

// range_locked checks that [p, p+n) is covered by mappings with the access
// asked for (mu held).
static int range_locked(uintptr_t p, size_t n, int write, int *phys, int *rdma) {
	int want = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
	uintptr_t cur = p;
	do {
		struct mapping *m = mapping_at(cur);
		if (!m)
			return STANDIN_NOT_MAPPED;
		if ((m->access & want) != want)
			return STANDIN_NO_ACCESS;
		if (cur == p && phys)
			*phys = m->a->phys;
		if (cur == p && rdma)
			*rdma = m->a->rdma;
		cur = m->ptr + m->size;
	} while (cur < p + n);
	return 0;
}

// pin_locked adds delta to the pins (how) of the mappings over [p, p+n).
static void pin_locked(uintptr_t p, size_t n, enum standin_pin_kind how, int delta) {
	uintptr_t cur = p;
	do {
		struct mapping *m = mapping_at(cur);
		if (!m)
			break;
		*(how == PIN_IO ? &m->pins : &m->regs) += delta;
		cur = m->ptr + m->size;
	} while (cur < p + n);
	pthread_cond_broadcast(&st.progress);
}

int standin_pin(uintptr_t p, size_t n, int write, enum standin_pin_kind how, int *phys, int *rdma) {
	lock();
	int r = range_locked(p, n, write, phys, rdma);
	if (!r)
		pin_locked(p, n, how, 1);
	unlock();
	return r;
}

void standin_unpin(uintptr_t p, size_t n, enum standin_pin_kind how) {
	lock();
	pin_locked(p, n, how, -1);
	unlock();
}

static const char *range_problem(int r) {
	return r == STANDIN_NOT_MAPPED ? "is not mapped device memory" : "is not accessible (cuMemSetAccess)";
}

static void alloc_put(struct alloc *a) {
	if (!a->live && a->maps == 0 && a->fd >= 0) {
		close(a->fd);
		a->fd = -1;
	}
}

static CUresult check_prop(const char *call, const CUmemAllocationProp *prop, int *phys) {
	if (!prop)
		return violate(CUDA_ERROR_INVALID_VALUE, "%s: no CUmemAllocationProp", call);
	if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return violate(CUDA_ERROR_INVALID_VALUE, "%s: allocation type %d (only PINNED is modelled)", call,
		               prop->type);
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return violate(CUDA_ERROR_INVALID_VALUE, "%s: location type %d (only DEVICE is modelled)", call,
		               prop->location.type);
	if (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return violate(CUDA_ERROR_NOT_SUPPORTED, "%s: handle types %#x (only POSIX_FILE_DESCRIPTOR here)", call,
		               prop->requestedHandleTypes);
	return device_phys(call, prop->location.id, phys);
}

CUresult cuMemGetAllocationGranularity(size_t *gran, const CUmemAllocationProp *prop, int option) {
	lock();
	int phys;
	CUresult r = enter("cuMemGetAllocationGranularity", 1);
	if (!r)
		r = check_prop("cuMemGetAllocationGranularity", prop, &phys);
	if (!r && option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: option %d", option);
	if (!r)
		*gran = GRAN;
	unlock();
	return r;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
	lock();
	int phys = 0;
	CUresult r = enter("cuMemCreate", 1);
	if (!r)
		r = check_prop("cuMemCreate", prop, &phys);
	if (!r && (size == 0 || size % GRAN))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: size %zu is not a multiple of the granularity %d", size,
		            GRAN);
	if (!r && flags)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: flags %llu (must be 0)", flags);
	if (!r && prop->allocFlags.gpuDirectRDMACapable && !st.rdma)
		r = violate(CUDA_ERROR_NOT_SUPPORTED,
		            "cuMemCreate: gpuDirectRDMACapable set but device attribute 110 "
		            "(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) is 0");
	if (!r) {
		struct alloc *a = calloc(1, sizeof *a);
		char name[96];
		snprintf(name, sizeof name, "cuda-standin-gpu%d-types%d-rdma%d", phys, prop->requestedHandleTypes,
		         prop->allocFlags.gpuDirectRDMACapable ? 1 : 0);
		a->fd = memfd_create(name, MFD_CLOEXEC);
		if (a->fd < 0 || ftruncate(a->fd, (off_t)size) != 0) {
			if (a->fd >= 0)
				close(a->fd);
			free(a);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			a->live = 1;
			a->size = size;
			a->phys = phys;
			a->types = prop->requestedHandleTypes;
			a->rdma = prop->allocFlags.gpuDirectRDMACapable ? 1 : 0;
			*h = standin_handle(K_ALLOC, standin_push(&st.allocs, a));
			live_add_locked(LIVE_ALLOCATIONS, 1);
		}
	}
	unlock();
	return r;
}

// alloc_get returns the live allocation of handle h, or records why not.
static struct alloc *alloc_get(const char *call, CUmemGenericAllocationHandle h, CUresult *r) {
	struct alloc *a = standin_lookup(&st.allocs, K_ALLOC, h);
	if (!a)
		*r = violate(CUDA_ERROR_INVALID_VALUE, "%s: %#llx is not a memory handle", call, h);
	else if (!a->live)
		*r = violate(CUDA_ERROR_INVALID_VALUE, "%s: handle %#llx was already released (use after release)", call, h);
	return *r ? NULL : a;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
	lock();
	CUresult r = enter("cuMemRelease", 1);
	struct alloc *a = r ? NULL : alloc_get("cuMemRelease", h, &r);
	if (a) {
		a->live = 0;
		alloc_put(a);
		live_add_locked(a->imported ? LIVE_IMPORTS : LIVE_ALLOCATIONS, -1);
	}
	unlock();
	return r;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
	lock();
	CUresult r = enter("cuMemAddressReserve", 1);
	if (!r && (size == 0 || size % GRAN))
		r = violate(CUDA_ERROR_INVALID_VALUE,
		            "cuMemAddressReserve: size %zu is not a multiple of the granularity %d", size, GRAN);
	if (!r && (align & (align - 1)))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve: alignment %zu is not a power of two", align);
	if (!r && flags)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve: flags %llu (must be 0)", flags);
	if (!r) {
		size_t al = align > GRAN ? align : GRAN;
		char *p = mmap(NULL, size + al, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			uintptr_t base = ((uintptr_t)p + al - 1) & ~(uintptr_t)(al - 1);
			if (base > (uintptr_t)p)
				munmap(p, base - (uintptr_t)p);
			if ((uintptr_t)p + al > base)
				munmap((char *)base + size, (uintptr_t)p + al - base);
			struct resv *v = calloc(1, sizeof *v);
			v->live = 1;
			v->base = base;
			v->size = size;
			standin_push(&st.resvs, v);
			*ptr = base;
			live_add_locked(LIVE_RESERVATIONS, 1);
		}
	}
	(void)addr; // a hint only
	unlock();
	return r;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
	lock();
	CUresult r = enter("cuMemAddressFree", 1);
	struct resv *v = r ? NULL : resv_at(ptr);
	if (!r && (!v || v->base != ptr || v->size != size))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree: [%#llx, +%zu) is not a reservation", ptr, size);
	for (size_t i = 0; !r && i < st.maps.n; i++) {
		struct mapping *m = st.maps.p[i];
		if (m->live && m->ptr >= v->base && m->ptr - v->base < v->size)
			r = violate(CUDA_ERROR_INVALID_VALUE,
			            "cuMemAddressFree: the reservation at %#llx still has a mapping at %#lx (unmap it first)", ptr,
			            (unsigned long)m->ptr);
	}
	if (!r) {
		munmap((void *)v->base, v->size);
		v->live = 0;
		live_add_locked(LIVE_RESERVATIONS, -1);
	}
	unlock();
	return r;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags) {
	lock();
	CUresult r = enter("cuMemMap", 1);
	struct alloc *a = r ? NULL : alloc_get("cuMemMap", h, &r);
	struct resv *v = r ? NULL : resv_at(ptr);
	if (!r && (ptr % GRAN || size == 0 || size % GRAN || offset % GRAN))
		r = violate(CUDA_ERROR_INVALID_VALUE,
		            "cuMemMap: address %#llx, size %zu or offset %zu is not a multiple of the granularity %d", ptr, size,
		            offset, GRAN);
	if (!r && offset)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemMap: offset %zu (currently must be zero)", offset);
	if (!r && size > a->size)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemMap: size %zu beyond the allocation's %zu", size, a->size);
	if (!r && (!v || ptr + size > v->base + v->size))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemMap: [%#llx, +%zu) is not inside one reservation", ptr, size);
	if (!r && flags)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemMap: flags %llu (must be 0)", flags);
	for (size_t i = 0; !r && i < st.maps.n; i++) {
		struct mapping *m = st.maps.p[i];
		if (m->live && m->ptr < ptr + size && ptr < m->ptr + m->size)
			r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemMap: [%#llx, +%zu) is already mapped", ptr, size);
	}
	if (!r) {
		if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, 0) == MAP_FAILED) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			struct mapping *m = calloc(1, sizeof *m);
			m->live = 1;
			m->ptr = ptr;
			m->size = size;
			m->a = a;
			a->maps++;
			standin_push(&st.maps, m);
			live_add_locked(LIVE_MAPPINGS, 1);
		}
	}
	unlock();
	return r;
}

// whole_mappings checks that [ptr, ptr+size) is exactly a run of whole
// mappings.
static int whole_mappings(uintptr_t ptr, size_t size) {
	for (uintptr_t cur = ptr; cur < ptr + size;) {
		struct mapping *m = mapping_at(cur);
		if (!m || m->ptr != cur || m->ptr + m->size > ptr + size)
			return 0;
		cur = m->ptr + m->size;
	}
	return size > 0;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
	lock();
	CUresult r = enter("cuMemUnmap", 1);
	if (!r && !whole_mappings(ptr, size))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemUnmap: [%#llx, +%zu) is not what was mapped", ptr, size);
	for (uintptr_t cur = ptr; !r && cur < ptr + size;) {
		struct mapping *m = mapping_at(cur);
		if (m->regs)
			violate(0, "cuMemUnmap: [%#lx, +%zu) is still registered with cuFileBufRegister (deregister first)",
			        (unsigned long)m->ptr, m->size);
		if (m->pins) {
			violate(0, "cuMemUnmap: [%#lx, +%zu) is in use by a copy or cuFileRead in flight (waiting for it)",
			        (unsigned long)m->ptr, m->size);
			while (m->pins)
				pthread_cond_wait(&st.progress, &st.mu);
		}
		mmap((void *)m->ptr, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
		m->live = 0;
		m->a->maps--;
		alloc_put(m->a);
		live_add_locked(LIVE_MAPPINGS, -1);
		cur = m->ptr + m->size;
	}
	unlock();
	return r;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
	lock();
	CUresult r = enter("cuMemSetAccess", 1);
	if (!r && !whole_mappings(ptr, size))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: [%#llx, +%zu) is not a fully mapped range", ptr,
		            size);
	if (!r && (count != 1 || !desc))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: %zu descriptors (the stand-in models one)", count);
	if (!r && desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: location type %d (DEVICE expected)",
		            desc->location.type);
	if (!r && desc->flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
	    desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: flags %d", desc->flags);
	int phys = -1;
	if (!r)
		r = device_phys("cuMemSetAccess", desc->location.id, &phys);
	for (uintptr_t cur = ptr; !r && cur < ptr + size;) {
		struct mapping *m = mapping_at(cur);
		if (m->a->phys != phys)
			r = violate(CUDA_ERROR_INVALID_DEVICE,
			            "cuMemSetAccess: device %d is not the memory's GPU (that is device %d here, %d physical)",
			            desc->location.id, standin_ordinal(m->a->phys), m->a->phys);
		cur = m->ptr + m->size;
	}
	if (!r) {
		int prot = desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
		           : desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
		                                                             : PROT_NONE;
		mprotect((void *)ptr, size, prot);
		for (uintptr_t cur = ptr; cur < ptr + size;) {
			struct mapping *m = mapping_at(cur);
			m->access = desc->flags;
			cur = m->ptr + m->size;
		}
	}
	unlock();
	return r;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
	lock();
	CUresult r = enter("cuMemGetAddressRange", 1);
	struct mapping *m = r ? NULL : mapping_at(ptr);
	if (!r && !m)
		r = violate(CUDA_ERROR_NOT_FOUND, "cuMemGetAddressRange: %#llx is not mapped device memory", ptr);
	if (!r) {
		if (base)
			*base = m->ptr;
		if (size)
			*size = m->size;
	}
	unlock();
	return r;
}

CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type, unsigned long long flags) {
	lock();
	CUresult r = enter("cuMemExportToShareableHandle", 1);
	struct alloc *a = r ? NULL : alloc_get("cuMemExportToShareableHandle", h, &r);
	if (!r && (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !(a->types & type)))
		r = violate(CUDA_ERROR_INVALID_VALUE,
		            "cuMemExportToShareableHandle: handle type %d was not requested at creation (requested %#x)", type,
		            a->types);
	if (!r && flags)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemExportToShareableHandle: flags %llu (must be 0)", flags);
	if (!r) {
		int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
		struct stat s;
		if (fd < 0 || fstat(fd, &s) != 0) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			for (size_t i = 0; i < st.exports.n; i++) {
				struct exported *e = st.exports.p[i];
				if (e->open && e->fd == fd) { // its number was closed and reused
					e->open = 0;
					st.live[LIVE_HANDLES]--;
				}
			}
			struct exported *e = calloc(1, sizeof *e);
			*e = (struct exported){.open = 1, .fd = fd, .dev = s.st_dev, .ino = s.st_ino};
			standin_push(&st.exports, e);
			*(int *)out = fd;
			live_add_locked(LIVE_HANDLES, 1);
		}
	}
	unlock();
	return r;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type) {
	lock();
	CUresult r = enter("cuMemImportFromShareableHandle", 1);
	int fd = (int)(intptr_t)os, phys = -1, types = 0, rdma = 0;
	char link[256] = "";
	struct stat s;
	if (!r && type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemImportFromShareableHandle: handle type %d", type);
	if (!r) {
		char path[64];
		snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
		ssize_t n = readlink(path, link, sizeof link - 1);
		link[n > 0 ? n : 0] = 0;
		if (fstat(fd, &s) != 0 ||
		    sscanf(link, "/memfd:cuda-standin-gpu%d-types%d-rdma%d", &phys, &types, &rdma) != 3)
			r = violate(CUDA_ERROR_INVALID_VALUE,
			            "cuMemImportFromShareableHandle: descriptor %d (%s) is not exported device memory", fd, link);
	}
	if (!r && standin_ordinal(phys) < 0)
		r = CUDA_ERROR_NOT_SUPPORTED; // its GPU is hidden here
	if (!r) {
		struct alloc *a = calloc(1, sizeof *a);
		a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		a->live = a->imported = 1;
		a->size = (size_t)s.st_size;
		a->phys = phys;
		a->types = types;
		a->rdma = rdma;
		*h = standin_handle(K_ALLOC, standin_push(&st.allocs, a));
		live_add_locked(LIVE_IMPORTS, 1);
	}
	unlock();
	return r;
}

// ---- host registration

// host_mapped checks /proc/self/maps: 0 when [p, p+n) is mapped readable
// (and writable when write), 1 when part is unmapped, 2 when read-only.
static int host_mapped(uintptr_t p, size_t n, int write) {
	FILE *f = fopen("/proc/self/maps", "re");
	if (!f)
		return 0;
	uintptr_t cur = p;
	int bad = 0;
	char line[512];
	while (cur < p + n && !bad && fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		char perms[8];
		int whole = strchr(line, '\n') != NULL;
		int ok = sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3;
		while (!whole && fgets(line, sizeof line, f)) // the rest of a long line
			whole = strchr(line, '\n') != NULL;
		if (!ok || hi <= cur)
			continue;
		if (lo > cur)
			break;
		if (perms[0] != 'r' || (write && perms[1] != 'w'))
			bad = 2;
		cur = hi;
	}
	fclose(f);
	return bad ? bad : cur < p + n;
}

CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
	lock();
	uintptr_t b = (uintptr_t)p;
	CUresult r = enter("cuMemHostRegister", 1);
	if (!r && (!p || !size))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister: pointer %p, size %zu", p, size);
	if (!r && (flags & ~0xfu))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister: flags %#x", flags);
	for (size_t i = 0; !r && i < st.hostregs.n; i++) {
		struct hostreg *h = st.hostregs.p[i];
		if (h->live && h->base < b + size && b < h->base + h->size)
			r = violate(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
			            "cuMemHostRegister: [%p, +%zu) overlaps the registered [%#lx, +%zu)", p, size,
			            (unsigned long)h->base, h->size);
	}
	int mapped = r ? 0 : host_mapped(b, size, !(flags & CU_MEMHOSTREGISTER_READ_ONLY));
	if (mapped == 1)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister: [%p, +%zu) is not all mapped", p, size);
	if (mapped == 2)
		r = violate(CUDA_ERROR_NOT_SUPPORTED,
		            "cuMemHostRegister: [%p, +%zu) is mapped read-only (needs the READ_ONLY flag)", p, size);
	if (!r) {
		struct hostreg *h = calloc(1, sizeof *h);
		*h = (struct hostreg){.live = 1, .base = b, .size = size};
		standin_push(&st.hostregs, h);
		live_add_locked(LIVE_HOST_REGISTRATIONS, 1);
	}
	unlock();
	return r;
}

CUresult cuMemHostRegister(void *p, size_t size, unsigned int flags) { return cuMemHostRegister_v2(p, size, flags); }

CUresult cuMemHostUnregister(void *p) {
	lock();
	CUresult r = enter("cuMemHostUnregister", 1);
	struct hostreg *found = NULL;
	for (size_t i = 0; !r && !found && i < st.hostregs.n; i++) {
		struct hostreg *h = st.hostregs.p[i];
		if (h->live && h->base == (uintptr_t)p)
			found = h;
	}
	if (!r && !found)
		r = violate(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "cuMemHostUnregister: %p is not a registered base", p);
	if (!r) {
		found->live = 0;
		live_add_locked(LIVE_HOST_REGISTRATIONS, -1);
	}
	unlock();
	return r;
}

// ---- streams, events, copies

enum { OP_COPY, OP_KERNEL, OP_MARK, OP_WAIT, OP_STOP, OP_PART };

// A mark recorded on the legacy default stream: it completes when every
// blocking stream of its context has finished the work queued on it
// before the record (cuda-runtime-api "Stream synchronization behavior":
// the legacy default stream waits for all blocking streams of the
// context), one OP_PART in each such stream counting down.
struct legacy_mark {
	int left;
	struct event *ev;
	unsigned long seq;
};

struct op {
	struct op *next;
	int kind;
	const char *call;
	char *dst;
	const char *src;
	size_t dpitch, spitch, width, height;
	int dst_dev, src_dev;
	unsigned delay_us;
	struct event *ev;
	unsigned long seq;
	struct legacy_mark *part; // OP_PART
};

static int is_default_stream(CUstream s) { return !s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD; }

static size_t span(size_t pitch, size_t width, size_t height) { return height ? (height - 1) * pitch + width : 0; }

// copy_locked runs a copy (mu held, dropped while bytes move), checking
// its device ranges again: they may have been unmapped since it was
// enqueued.
static void copy_locked(struct op *o) {
	size_t dn = span(o->dpitch, o->width, o->height), sn = span(o->spitch, o->width, o->height);
	int r = 0;
	if (o->dst_dev && (r = range_locked((uintptr_t)o->dst, dn, 1, NULL, NULL)))
		violate(0, "%s: when the copy ran, the destination [%p, +%zu) %s", o->call, o->dst, dn, range_problem(r));
	if (!r && o->src_dev && (r = range_locked((uintptr_t)o->src, sn, 0, NULL, NULL)))
		violate(0, "%s: when the copy ran, the source [%p, +%zu) %s", o->call, o->src, sn, range_problem(r));
	if (r)
		return;
	if (o->dst_dev)
		pin_locked((uintptr_t)o->dst, dn, PIN_IO, 1);
	if (o->src_dev)
		pin_locked((uintptr_t)o->src, sn, PIN_IO, 1);
	unlock();
	for (size_t i = 0; i < o->height; i++)
		memcpy(o->dst + i * o->dpitch, o->src + i * o->spitch, o->width);
	lock();
	if (o->dst_dev)
		pin_locked((uintptr_t)o->dst, dn, PIN_IO, -1);
	if (o->src_dev)
		pin_locked((uintptr_t)o->src, sn, PIN_IO, -1);
	st.stat[STAT_COPIES]++;
}

static void run_locked(struct op *o) {
	switch (o->kind) {
	case OP_KERNEL:
		unlock();
		if (o->delay_us)
			usleep(o->delay_us);
		lock();
		copy_locked(o);
		break;
	case OP_COPY: copy_locked(o); break;
	case OP_MARK:
		if (o->ev->done < o->seq)
			o->ev->done = o->seq;
		break;
	case OP_PART:
		if (--o->part->left == 0) {
			if (o->part->ev->done < o->part->seq)
				o->part->ev->done = o->part->seq;
			free(o->part);
		}
		break;
	case OP_WAIT:
		while (o->ev->done < o->seq)
			pthread_cond_wait(&st.progress, &st.mu);
		break;
	}
}

static void *worker(void *arg) {
	struct stream *s = arg;
	lock();
	for (int stop = 0; !stop;) {
		while (!s->head)
			pthread_cond_wait(&s->cond, &st.mu);
		struct op *o = s->head;
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		stop = o->kind == OP_STOP;
		run_locked(o);
		s->done++;
		pthread_cond_broadcast(&st.progress);
		free(o);
	}
	s->running = 0;
	pthread_cond_broadcast(&st.progress);
	unlock();
	return NULL;
}

// stream_get returns the live stream s, or records why not.
static struct stream *stream_get(const char *call, CUstream s, CUresult *r) {
	struct stream *x = standin_lookup(&st.streams, K_STREAM, (uintptr_t)s);
	if (!x)
		*r = violate(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a stream", call, (void *)s);
	else if (!x->live)
		*r = violate(CUDA_ERROR_INVALID_HANDLE, "%s: stream %p was destroyed", call, (void *)s);
	return *r ? NULL : x;
}

static struct event *event_get(const char *call, CUevent e, CUresult *r) {
	struct event *x = standin_lookup(&st.events, K_EVENT, (uintptr_t)e);
	if (!x)
		*r = violate(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not an event", call, (void *)e);
	else if (!x->live)
		*r = violate(CUDA_ERROR_INVALID_HANDLE, "%s: event %p was destroyed", call, (void *)e);
	return *r ? NULL : x;
}

// submit runs o now on a default stream, or queues it on x.
static void submit(struct stream *x, struct op *o) {
	if (!x) {
		run_locked(o);
		free(o);
		return;
	}
	o->next = NULL;
	if (x->tail)
		x->tail->next = o;
	else
		x->head = o;
	x->tail = o;
	x->enq++;
	pthread_cond_signal(&x->cond);
}

static void wait_stream_locked(struct stream *x) {
	unsigned long target = x->enq;
	while (x->done < target)
		pthread_cond_wait(&st.progress, &st.mu);
}

CUresult cuStreamCreate(CUstream *ps, unsigned int flags) {
	lock();
	CUresult r = enter("cuStreamCreate", 1);
	if (!r && flags & ~(unsigned)CU_STREAM_NON_BLOCKING)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate: flags %#x", flags);
	if (!r) {
		struct stream *x = calloc(1, sizeof *x);
		x->live = x->running = 1;
		x->phys = cur_phys();
		x->flags = flags;
		pthread_cond_init(&x->cond, NULL);
		pthread_t t;
		if (pthread_create(&t, NULL, worker, x) != 0) {
			free(x);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			pthread_detach(t);
			*ps = (CUstream)(uintptr_t)standin_handle(K_STREAM, standin_push(&st.streams, x));
			live_add_locked(LIVE_STREAMS, 1);
		}
	}
	unlock();
	return r;
}

static CUresult stream_destroy(const char *call, CUstream s) {
	lock();
	CUresult r = enter(call, 1);
	struct stream *x = r ? NULL : stream_get(call, s, &r);
	if (x) {
		x->live = 0; // its work still runs, then its thread ends
		struct op *o = calloc(1, sizeof *o);
		o->kind = OP_STOP;
		submit(x, o);
		live_add_locked(LIVE_STREAMS, -1);
	}
	unlock();
	return r;
}

CUresult cuStreamDestroy(CUstream s) { return stream_destroy("cuStreamDestroy", s); }
CUresult cuStreamDestroy_v2(CUstream s) { return stream_destroy("cuStreamDestroy_v2", s); }

CUresult cuStreamSynchronize(CUstream s) {
	lock();
	CUresult r = enter("cuStreamSynchronize", 1);
	struct stream *x = r || is_default_stream(s) ? NULL : stream_get("cuStreamSynchronize", s, &r);
	if (x)
		wait_stream_locked(x);
	unlock();
	return r;
}

CUresult cuStreamQuery(CUstream s) {
	lock();
	CUresult r = enter("cuStreamQuery", 1);
	struct stream *x = r || is_default_stream(s) ? NULL : stream_get("cuStreamQuery", s, &r);
	if (x && x->done < x->enq)
		r = CUDA_ERROR_NOT_READY;
	unlock();
	return r;
}

CUresult cuCtxSynchronize(void) {
	lock();
	CUresult r = enter("cuCtxSynchronize", 1);
	if (!r) {
		st.ctx_syncs++;
		report_locked();
	}
	for (size_t i = 0; !r && i < st.streams.n; i++) {
		struct stream *x = st.streams.p[i];
		if (x->running && x->phys == cur_phys())
			wait_stream_locked(x);
	}
	unlock();
	return r;
}

CUresult cuEventCreate(CUevent *pe, unsigned int flags) {
	lock();
	CUresult r = enter("cuEventCreate", 1);
	if (!r && flags & ~7u)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: flags %#x", flags);
	if (!r && (flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: CU_EVENT_INTERPROCESS without CU_EVENT_DISABLE_TIMING");
	if (!r) {
		struct event *x = calloc(1, sizeof *x);
		x->live = 1;
		x->phys = cur_phys();
		x->flags = flags;
		*pe = (CUevent)(uintptr_t)standin_handle(K_EVENT, standin_push(&st.events, x));
		live_add_locked(LIVE_EVENTS, 1);
	}
	unlock();
	return r;
}

// record_legacy_locked records x on the legacy default stream (NULL or
// CU_STREAM_LEGACY): done once every blocking stream of the current
// context has run what was queued on it before; at once when none has
// work.
static void record_legacy_locked(struct event *x) {
	unsigned long seq = ++x->recorded;
	struct legacy_mark *m = calloc(1, sizeof *m);
	m->ev = x;
	m->seq = seq;
	m->left = 1; // the record itself, dropped below
	for (size_t i = 0; i < st.streams.n; i++) {
		struct stream *y = st.streams.p[i];
		if (!y->live || !y->running || y->phys != x->phys || (y->flags & CU_STREAM_NON_BLOCKING) || y->done == y->enq)
			continue;
		struct op *o = calloc(1, sizeof *o);
		o->kind = OP_PART;
		o->part = m;
		m->left++;
		submit(y, o);
	}
	struct op self = {.kind = OP_PART, .part = m};
	run_locked(&self);
}

CUresult cuEventRecord(CUevent e, CUstream s) {
	lock();
	CUresult r = enter("cuEventRecord", 1);
	struct event *x = r ? NULL : event_get("cuEventRecord", e, &r);
	struct stream *y = r || is_default_stream(s) ? NULL : stream_get("cuEventRecord", s, &r);
	int sphys = y ? y->phys : cur_phys();
	if (!r && x->phys != sphys)
		r = violate(CUDA_ERROR_INVALID_HANDLE,
		            "cuEventRecord: the event (GPU %d) and the stream (GPU %d) are not from the same context", x->phys,
		            sphys);
	if (!r && !y && s != CU_STREAM_PER_THREAD)
		record_legacy_locked(x);
	else if (!r) {
		struct op *o = calloc(1, sizeof *o);
		o->kind = OP_MARK;
		o->ev = x;
		o->seq = ++x->recorded;
		submit(y, o);
	}
	unlock();
	return r;
}

CUresult cuEventQuery(CUevent e) {
	lock();
	CUresult r = enter("cuEventQuery", 1);
	struct event *x = r ? NULL : event_get("cuEventQuery", e, &r);
	if (x && x->done < x->recorded)
		r = CUDA_ERROR_NOT_READY;
	unlock();
	return r;
}

CUresult cuEventSynchronize(CUevent e) {
	lock();
	CUresult r = enter("cuEventSynchronize", 1);
	struct event *x = r ? NULL : event_get("cuEventSynchronize", e, &r);
	if (x) {
		if (!(x->flags & CU_EVENT_BLOCKING_SYNC) && !x->spun) {
			x->spun = 1; // the real driver spins a core waiting for it
			st.spinning_events++;
			report_locked();
		}
		unsigned long target = x->recorded;
		while (x->done < target)
			pthread_cond_wait(&st.progress, &st.mu);
	}
	unlock();
	return r;
}

static CUresult event_destroy(const char *call, CUevent e) {
	lock();
	CUresult r = enter(call, 1);
	struct event *x = r ? NULL : event_get(call, e, &r);
	if (x) {
		x->live = 0;
		live_add_locked(LIVE_EVENTS, -1);
	}
	unlock();
	return r;
}

CUresult cuEventDestroy(CUevent e) { return event_destroy("cuEventDestroy", e); }
CUresult cuEventDestroy_v2(CUevent e) { return event_destroy("cuEventDestroy_v2", e); }

CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
	lock();
	CUresult r = enter("cuStreamWaitEvent", 1);
	struct event *x = r ? NULL : event_get("cuStreamWaitEvent", e, &r);
	struct stream *y = r || is_default_stream(s) ? NULL : stream_get("cuStreamWaitEvent", s, &r);
	if (!r && flags)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent: flags %#x", flags);
	if (!r) {
		struct op *o = calloc(1, sizeof *o);
		o->kind = OP_WAIT;
		o->ev = x;
		o->seq = x->recorded;
		submit(y, o);
	}
	unlock();
	return r;
}

CUresult standin_memcpy2d(const char *call, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t height, int kind, CUstream s) {
	lock();
	CUresult r = enter(call, 1);
	struct stream *x = r || is_default_stream(s) ? NULL : stream_get(call, s, &r);
	if (!r && height > 1 && (width > dpitch || width > spitch))
		r = violate(CUDA_ERROR_INVALID_VALUE, "%s: width %zu is more than a pitch (%zu, %zu)", call, width, dpitch,
		            spitch);
	if (!r && (kind < 0 || kind > 4))
		r = violate(CUDA_ERROR_INVALID_VALUE, "%s: copy kind %d", call, kind);
	int dst_dev = kind == 1 || kind == 3 || (kind == 4 && resv_at((uintptr_t)dst));
	int src_dev = kind == 2 || kind == 3 || (kind == 4 && resv_at((uintptr_t)src));
	size_t dn = span(dpitch, width, height), sn = span(spitch, width, height);
	int p = 0;
	if (!r && dn && dst_dev && (p = range_locked((uintptr_t)dst, dn, 1, NULL, NULL)))
		r = violate(CUDA_ERROR_INVALID_VALUE, "%s: the destination [%p, +%zu) %s", call, dst, dn, range_problem(p));
	if (!r && sn && src_dev && (p = range_locked((uintptr_t)src, sn, 0, NULL, NULL)))
		r = violate(CUDA_ERROR_INVALID_VALUE, "%s: the source [%p, +%zu) %s", call, src, sn, range_problem(p));
	if (!r && width && height) {
		struct op *o = calloc(1, sizeof *o);
		*o = (struct op){.kind = OP_COPY, .call = call, .dst = dst, .src = src, .dpitch = dpitch, .spitch = spitch,
		                 .width = width, .height = height, .dst_dev = dst_dev, .src_dev = src_dev};
		submit(x, o);
	}
	unlock();
	return r;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	return standin_memcpy2d("cuMemcpyHtoD", (void *)dst, n, src, n, n, 1, 1, NULL);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	return standin_memcpy2d("cuMemcpyDtoH", dst, n, (const void *)src, n, n, 1, 2, NULL);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
	return standin_memcpy2d("cuMemcpyHtoDAsync", (void *)dst, n, src, n, n, 1, 1, s);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
	return standin_memcpy2d("cuMemcpyDtoHAsync", dst, n, (const void *)src, n, n, 1, 2, s);
}

// cuStandinLaunchRead (a test hook) enqueues on s a "kernel" that sleeps
// delay_us, then copies n bytes of device memory at src to host_dst: the
// consumer's GPU work still reading a slot.
CUresult cuStandinLaunchRead(CUstream s, CUdeviceptr src, size_t n, unsigned delay_us, void *host_dst) {
	lock();
	CUresult r = enter("cuStandinLaunchRead", 1);
	struct stream *x = r || is_default_stream(s) ? NULL : stream_get("cuStandinLaunchRead", s, &r);
	int p = 0;
	if (!r && (p = range_locked(src, n, 0, NULL, NULL)))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuStandinLaunchRead: the source [%#llx, +%zu) %s", src, n,
		            range_problem(p));
	if (!r) {
		struct op *o = calloc(1, sizeof *o);
		*o = (struct op){.kind = OP_KERNEL, .call = "cuStandinLaunchRead", .dst = host_dst,
		                 .src = (const char *)(uintptr_t)src, .dpitch = n, .spitch = n, .width = n, .height = 1,
		                 .src_dev = 1, .delay_us = delay_us};
		submit(x, o);
	}
	unlock();
	return r;
}

// ---- what NVIDIA's libcufile.so.0 resolves besides
//
// The real libcufile (the nvidia-cufile wheel) dlsyms about 35 more driver
// entry points at cuFileDriverOpen and refuses to start ("missing cuda
// symbols while dynamic loading", 5033) if one is absent. Those its host
// logic calls on a machine without nvidia-fs (compatibility mode) are
// modelled: contexts it creates, pointer attributes of device memory,
// pinned host memory, unified copies and memsets, streams with a
// priority. Every other one records a violation naming itself and
// returns CUDA_ERROR_NOT_SUPPORTED: a test that reaches it learns that
// cuFile took a path the stand-in does not model.

// unexpected records that a resolved entry point no modelled path calls
// was called.
#define UNEXPECTED(name)                                                                                              \
	CUresult name() {                                                                                                 \
		return standin_violation(CUDA_ERROR_NOT_SUPPORTED,                                                            \
		                         #name ": called, and not modelled by the stand-in (only resolved by libcufile)");    \
	}

UNEXPECTED(cuCtxEnablePeerAccess)
UNEXPECTED(cuEventElapsedTime)
UNEXPECTED(cuGetExportTable)
UNEXPECTED(cuIpcCloseMemHandle)
UNEXPECTED(cuIpcGetEventHandle)
UNEXPECTED(cuIpcGetMemHandle)
UNEXPECTED(cuIpcOpenEventHandle)
UNEXPECTED(cuIpcOpenMemHandle_v2)
UNEXPECTED(cuLaunchHostFunc)
UNEXPECTED(cuMemAllocManaged)
UNEXPECTED(cuMemcpyPeer)
UNEXPECTED(cuMemcpyPeerAsync)
UNEXPECTED(cuStreamWaitValue32)
UNEXPECTED(cuStreamWaitValue32_v2)
UNEXPECTED(cuStreamWriteValue32)
UNEXPECTED(cuStreamWriteValue32_v2)

// cuMemAlloc_v2: device memory of the current context's GPU, made as the
// VMM calls make it (created, reserved, mapped, readable and writable:
// rounded up to the granularity); cuMemFree_v2 undoes it. libcufile
// allocates some at cuFileDriverOpen to probe PCI P2PDMA.
// ctxalloc is memory of cuMemAlloc made while a context of cuCtxCreate
// was current: cuCtxDestroy frees it ("Destroys the CUDA context ... all
// the resources allocated in it").
struct ctxalloc {
	int live;
	unsigned long ctx;
	CUdeviceptr p;
	size_t size;
};

static struct ctxalloc *ctxalloc_at(CUdeviceptr p, int any) {
	for (size_t i = 0; i < st.ctxallocs.n; i++) {
		struct ctxalloc *a = st.ctxallocs.p[i];
		if (a->p == p && (any || a->live))
			return a;
	}
	return NULL;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dp, size_t size) {
	lock();
	CUresult r = enter("cuMemAlloc_v2", 1);
	int phys = cur_phys();
	unsigned long made = tls_depth ? tls_made[tls_depth - 1] : 0;
	unlock();
	if (r)
		return r;
	if (!dp || size == 0)
		return standin_violation(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc_v2: dptr %p, size %zu", (void *)dp, size);
	size = (size + GRAN - 1) / GRAN * GRAN;
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
	                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = standin_ordinal(phys)}};
	CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemGenericAllocationHandle h;
	CUdeviceptr p;
	if ((r = cuMemCreate(&h, size, &prop, 0)))
		return r;
	if ((r = cuMemAddressReserve(&p, size, 0, 0, 0))) {
		cuMemRelease(h);
		return r;
	}
	if ((r = cuMemMap(p, size, 0, h, 0)) || (r = cuMemSetAccess(p, size, &acc, 1))) {
		cuMemUnmap(p, size);
		cuMemAddressFree(p, size);
		cuMemRelease(h);
		return r;
	}
	cuMemRelease(h); // the mapping keeps it
	*dp = p;
	if (made) {
		struct ctxalloc *a = calloc(1, sizeof *a);
		*a = (struct ctxalloc){.live = 1, .ctx = made, .p = p, .size = size};
		lock();
		standin_push(&st.ctxallocs, a);
		unlock();
	}
	return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	lock();
	struct ctxalloc *gone = ctxalloc_at(p, 1);
	if (gone && !gone->live) {
		// Freed with its context (cuCtxDestroy): the driver answers an
		// error, as libcufile's P2PDMA probe meets at every
		// cuFileDriverOpen (cuCtxCreate, cuMemAlloc, cuCtxDestroy, then
		// cuMemFree); not a violation of the caller's.
		gone->p = 0;
		unlock();
		return tls_depth ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_CONTEXT;
	}
	if (gone)
		gone->live = 0, gone->p = 0;
	CUresult r = enter("cuMemFree_v2", 1);
	struct mapping *m = r ? NULL : mapping_at(p);
	size_t size = m ? m->size : 0;
	if (!r && (!m || m->ptr != p))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemFree_v2: %#llx is not memory of cuMemAlloc", p);
	unlock();
	if (!r)
		r = cuMemUnmap(p, size);
	if (!r)
		r = cuMemAddressFree(p, size);
	return r;
}

// cuMemGetHandleForAddressRange (a dma-buf of device memory): the stand-in
// has no dma-buf (device attribute 124, DMA_BUF_SUPPORTED, is 0), so
// CUDA_ERROR_NOT_SUPPORTED, as a driver says without it.
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t size, int type, unsigned long long flags) {
	return CUDA_ERROR_NOT_SUPPORTED;
}

// cuCtxCreate_v2 (cuda.h: "Creates a new CUDA context and associates it
// with the calling thread"): a context of the GPU, current on the calling
// thread, alive until cuCtxDestroy. SIMPLER: it shares the primary
// context's handle (one address space per GPU either way).
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
	lock();
	int phys;
	CUresult r = enter("cuCtxCreate_v2", 0);
	if (!r && !pctx)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuCtxCreate_v2: pctx is NULL");
	if (!r)
		r = device_phys("cuCtxCreate_v2", dev, &phys);
	if (!r && tls_depth == MAX_STACK)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuCtxCreate_v2: context stack deeper than %d", MAX_STACK);
	if (!r) {
		st.ctx[phys].created++;
		tls_made[tls_depth] = ++st.ctx_ids;
		tls_ctx[tls_depth++] = phys + 1;
		*pctx = ctx_handle(phys);
	}
	unlock();
	return r;
}

// cuCtxDestroy_v2: "Destroys the CUDA context specified by ctx ... If ctx
// is current to the calling thread then ctx will also be popped"; the
// memory cuMemAlloc made in it goes with it (freed while it is still
// current).
CUresult cuCtxDestroy_v2(CUcontext c) {
	lock();
	int phys;
	CUresult r = enter("cuCtxDestroy_v2", 0);
	if (!r)
		r = ctx_phys("cuCtxDestroy_v2", c, &phys);
	if (!r && st.ctx[phys].created == 0)
		r = violate(CUDA_ERROR_INVALID_CONTEXT, "cuCtxDestroy_v2: GPU %d has no context made by cuCtxCreate", phys);
	unsigned long made = !r && cur_phys() == phys ? tls_made[tls_depth - 1] : 0;
	struct ctxalloc *freeing[64];
	int nf = 0;
	for (size_t i = 0; made && i < st.ctxallocs.n && nf < 64; i++) {
		struct ctxalloc *a = st.ctxallocs.p[i];
		if (a->live && a->ctx == made) {
			a->live = 0;
			freeing[nf++] = a;
		}
	}
	unlock();
	for (int i = 0; i < nf; i++) {
		cuMemUnmap(freeing[i]->p, freeing[i]->size);
		cuMemAddressFree(freeing[i]->p, freeing[i]->size);
	}
	if (r)
		return r;
	lock();
	st.ctx[phys].created--;
	if (made)
		tls_depth--;
	unlock();
	return r;
}

// cuCtxGetStreamPriorityRange: CUDA's usual range, 0 (least) to -5.
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
	lock();
	CUresult r = enter("cuCtxGetStreamPriorityRange", 1);
	if (!r) {
		if (least)
			*least = 0;
		if (greatest)
			*greatest = -5;
	}
	unlock();
	return r;
}

// cuStreamCreateWithPriority: a stream as cuStreamCreate makes, the
// priority (one of the range's) not modelled.
CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int priority) {
	if (priority > 0 || priority < -5)
		return standin_violation(CUDA_ERROR_INVALID_VALUE, "cuStreamCreateWithPriority: priority %d", priority);
	return cuStreamCreate(ps, flags);
}

// cuDeviceCanAccessPeer: the stand-in has no peer access (see cuMemSetAccess).
CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
	lock();
	int phys;
	CUresult r = enter("cuDeviceCanAccessPeer", 0);
	if (!r)
		r = device_phys("cuDeviceCanAccessPeer", dev, &phys);
	if (!r)
		r = device_phys("cuDeviceCanAccessPeer", peer, &phys);
	if (!r)
		*can = 0;
	unlock();
	return r;
}

// Pinned host memory: cuMemHostAlloc ("Allocates bytesize bytes of host
// memory that is page-locked"), cuMemAllocHost_v2, freed by cuMemFreeHost;
// with unified addressing its device pointer is its host address
// (cuMemHostGetDevicePointer). Not counted as live: cuFile keeps its
// bounce buffers while its driver is open, which is the process's life.
struct hostalloc {
	int live;
	void *p;
	size_t size;
	unsigned flags;
};

static struct hostalloc *hostalloc_at(const void *p) {
	for (size_t i = 0; i < st.hostallocs.n; i++) {
		struct hostalloc *h = st.hostallocs.p[i];
		if (h->live && (uintptr_t)p >= (uintptr_t)h->p && (uintptr_t)p - (uintptr_t)h->p < h->size)
			return h;
	}
	return NULL;
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
	lock();
	CUresult r = enter("cuMemHostAlloc", 1);
	if (!r && (!pp || size == 0))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc: pp %p, size %zu", (void *)pp, size);
	if (!r && flags & ~0xfu)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc: flags %#x", flags);
	void *p = MAP_FAILED;
	if (!r && (p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) == MAP_FAILED)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	if (!r) {
		struct hostalloc *h = calloc(1, sizeof *h);
		*h = (struct hostalloc){.live = 1, .p = p, .size = size, .flags = flags};
		standin_push(&st.hostallocs, h);
		*pp = p;
	}
	unlock();
	return r;
}

CUresult cuMemAllocHost_v2(void **pp, size_t size) { return cuMemHostAlloc(pp, size, 0); }

CUresult cuMemFreeHost(void *p) {
	lock();
	CUresult r = enter("cuMemFreeHost", 1);
	struct hostalloc *h = r ? NULL : hostalloc_at(p);
	if (!r && (!h || h->p != p))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost: %p is not memory of cuMemHostAlloc", p);
	if (!r) {
		h->live = 0;
		munmap(h->p, h->size);
	}
	unlock();
	return r;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dp, void *p, unsigned int flags) {
	lock();
	CUresult r = enter("cuMemHostGetDevicePointer", 1);
	if (!r && flags)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemHostGetDevicePointer: flags %#x (must be 0)", flags);
	if (!r && !hostalloc_at(p))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuMemHostGetDevicePointer: %p is not pinned host memory", p);
	if (!r)
		*dp = (CUdeviceptr)(uintptr_t)p;
	unlock();
	return r;
}

// Pointer attributes (cuda.h's CUpointer_attribute), of device memory
// mapped here and of pinned host memory; cuPointerGetAttribute of any
// other address is CUDA_ERROR_INVALID_VALUE, as the driver answers for
// memory it does not know.
enum {
	PA_CONTEXT = 1,
	PA_MEMORY_TYPE = 2,
	PA_DEVICE_POINTER = 3,
	PA_HOST_POINTER = 4,
	PA_SYNC_MEMOPS = 6,
	PA_BUFFER_ID = 7,
	PA_IS_MANAGED = 8,
	PA_DEVICE_ORDINAL = 9,
	PA_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
	PA_RANGE_START_ADDR = 11,
	PA_RANGE_SIZE = 12,
	PA_MAPPED = 13,
	PA_ALLOWED_HANDLE_TYPES = 14,
	PA_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
	PA_ACCESS_FLAGS = 16,
	PA_MAPPING_SIZE = 18,
	PA_MAPPING_BASE_ADDR = 19,
	PA_MEMORY_BLOCK_ID = 20,
	MEMORYTYPE_HOST = 1,
	MEMORYTYPE_DEVICE = 2,
};

// pointer_attr fills one attribute of p (mu held); 1: p is not memory the
// stand-in knows, 2: the attribute is not modelled.
static int pointer_attr(void *data, int attr, uintptr_t p) {
	struct mapping *m = mapping_at(p);
	struct hostalloc *h = m ? NULL : hostalloc_at((void *)p);
	if (!m && !h)
		return 1;
	int phys = m ? m->a->phys : cur_phys();
	uintptr_t base = m ? m->ptr : (uintptr_t)h->p;
	size_t size = m ? m->size : h->size;
	switch (attr) {
	case PA_CONTEXT: *(CUcontext *)data = phys >= 0 ? ctx_handle(phys) : NULL; break;
	case PA_MEMORY_TYPE: *(unsigned *)data = m ? MEMORYTYPE_DEVICE : MEMORYTYPE_HOST; break;
	case PA_DEVICE_POINTER: *(CUdeviceptr *)data = p; break;
	case PA_HOST_POINTER:
		if (m)
			return 1;
		*(void **)data = (void *)p;
		break;
	case PA_SYNC_MEMOPS: *(int *)data = 1; break;
	case PA_BUFFER_ID: *(unsigned long long *)data = base; break;
	case PA_IS_MANAGED:
	case PA_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = 0; break;
	case PA_DEVICE_ORDINAL: *(int *)data = phys >= 0 ? standin_ordinal(phys) : -1; break;
	case PA_RANGE_START_ADDR:
	case PA_MAPPING_BASE_ADDR: *(CUdeviceptr *)data = base; break;
	case PA_RANGE_SIZE:
	case PA_MAPPING_SIZE: *(size_t *)data = size; break;
	case PA_MAPPED: *(int *)data = 1; break;
	case PA_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = m ? (unsigned)m->a->types : 0; break;
	case PA_IS_GPU_DIRECT_RDMA_CAPABLE: *(int *)data = m ? m->a->rdma : 0; break;
	case PA_ACCESS_FLAGS: *(int *)data = m ? m->access : CU_MEM_ACCESS_FLAGS_PROT_READWRITE; break;
	case PA_MEMORY_BLOCK_ID: *(unsigned long long *)data = base; break;
	default: return 2;
	}
	return 0;
}

CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
	lock();
	CUresult r = enter("cuPointerGetAttribute", 0);
	if (!r && !data)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute: data is NULL");
	int k = r ? 0 : pointer_attr(data, attr, p);
	if (k == 1)
		r = CUDA_ERROR_INVALID_VALUE; // not an error of the caller's: how it learns p is no device memory
	else if (k == 2)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute: attribute %d is not modelled", attr);
	unlock();
	return r;
}

// cuPointerGetAttributes: "Unlike cuPointerGetAttribute, this function
// will not return an error when the ptr encountered is not a valid CUDA
// pointer. Instead, the attributes are assigned default NULL values".
CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr p) {
	lock();
	CUresult r = enter("cuPointerGetAttributes", 0);
	for (unsigned i = 0; !r && i < n; i++) {
		int k = pointer_attr(data[i], attrs[i], p);
		if (k == 2)
			r = violate(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttributes: attribute %d is not modelled", attrs[i]);
		else if (k == 1) {
			if (attrs[i] == PA_DEVICE_ORDINAL)
				*(int *)data[i] = -2;
			else
				memset(data[i], 0, attrs[i] == PA_MEMORY_TYPE || attrs[i] == PA_SYNC_MEMOPS ? 4 : 8);
		}
	}
	unlock();
	return r;
}

// cuPointerSetAttribute: only CU_POINTER_ATTRIBUTE_SYNC_MEMOPS is settable,
// of device memory.
CUresult cuPointerSetAttribute(const void *value, int attr, CUdeviceptr p) {
	lock();
	CUresult r = enter("cuPointerSetAttribute", 0);
	if (!r && attr != PA_SYNC_MEMOPS)
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuPointerSetAttribute: attribute %d is not settable", attr);
	if (!r && !mapping_at(p))
		r = violate(CUDA_ERROR_INVALID_VALUE, "cuPointerSetAttribute: %#llx is not device memory", p);
	unlock();
	(void)value;
	return r;
}

// Unified copies (the direction from the addresses) and memsets of device
// memory.
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
	return standin_memcpy2d("cuMemcpy", (void *)dst, n, (const void *)src, n, n, 1, 4, NULL);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	return standin_memcpy2d("cuMemcpyAsync", (void *)dst, n, (const void *)src, n, n, 1, 4, s);
}

static CUresult memset8(const char *call, CUdeviceptr dst, unsigned char v, size_t n) {
	lock();
	CUresult r = enter(call, 1);
	int p = 0;
	if (!r && n && (p = range_locked(dst, n, 1, NULL, NULL)))
		r = violate(CUDA_ERROR_INVALID_VALUE, "%s: the destination [%#llx, +%zu) %s", call, dst, n, range_problem(p));
	if (!r && n) {
		pin_locked(dst, n, PIN_IO, 1);
		memset((void *)(uintptr_t)dst, v, n);
		pin_locked(dst, n, PIN_IO, -1);
	}
	unlock();
	return r;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) { return memset8("cuMemsetD8", dst, v, n); }

// cuMemsetD8Async: STRICTER than needed, done at once (after the stream's
// earlier work).
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
	if (!is_default_stream(s)) {
		CUresult r = cuStreamSynchronize(s);
		if (r)
			return r;
	}
	return memset8("cuMemsetD8Async", dst, v, n);
}

// ---- entry points

// Names cuGetProcAddress maps to their current ABI version (cuda.h's
// #defines of the same names).
static const char *versioned[][2] = {
    {"cuCtxPushCurrent", "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", "cuCtxPopCurrent_v2"},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"},
    {"cuDeviceGetUuid", "cuDeviceGetUuid_v2"},
    {"cuDeviceTotalMem", "cuDeviceTotalMem_v2"},
    {"cuStreamDestroy", "cuStreamDestroy_v2"},
    {"cuEventDestroy", "cuEventDestroy_v2"},
    {"cuMemHostRegister", "cuMemHostRegister_v2"},
    {"cuMemGetAddressRange", "cuMemGetAddressRange_v2"},
    {"cuMemcpyHtoD", "cuMemcpyHtoD_v2"},
    {"cuMemcpyDtoH", "cuMemcpyDtoH_v2"},
    {"cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2"},
    {"cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2"},
    {"cuGetProcAddress", "cuGetProcAddress_v2"},
};

// self_handle returns a dlopen handle of this library (for dlsym).
static void *self_handle(void) {
	static void *self;
	void *h = __atomic_load_n(&self, __ATOMIC_ACQUIRE);
	Dl_info info;
	if (!h && dladdr((void *)cuInit, &info)) {
		h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
		__atomic_store_n(&self, h, __ATOMIC_RELEASE);
	}
	return h;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, uint64_t flags, int *status) {
	const char *name = symbol ? symbol : "";
	for (size_t i = 0; i < sizeof versioned / sizeof *versioned; i++)
		if (strcmp(name, versioned[i][0]) == 0)
			name = versioned[i][1];
	void *self = self_handle();
	void *p = strncmp(name, "cu", 2) == 0 && self ? dlsym(self, name) : NULL;
	if (fn)
		*fn = p;
	if (status)
		*status = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	(void)version;
	(void)flags;
	if (!p)
		return standin_violation(CUDA_ERROR_NOT_FOUND, "cuGetProcAddress: %s is not implemented by the stand-in",
		                         name);
	return CUDA_SUCCESS;
}
