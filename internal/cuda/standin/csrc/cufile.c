// SPDX-License-Identifier: Apache-2.0
//
// libcufile.so.0 of the CUDA stand-in: cuFile over the stand-in driver
// (libcuda.so.1, rpath $ORIGIN). cuFileRead is a pread into the device
// memory's mapping; with an O_DIRECT descriptor and an unaligned offset,
// size or address it reads through an aligned bounce buffer, as cuFile does
// with its internal pinned buffers.
//
// Environment: CUFILE_STANDIN_MODE gds (default) or compat: in compat,
// reads counted as POSIX, nvfs version 0.0 in cuFileDriverGetProperties; in
// gds, reads counted as nvidia-fs reads; in both, per-GPU stats for every
// visible GPU, listed in REVERSE ordinal order. CUFILE_STANDIN_FAIL, a
// comma list: bufregister (cuFileBufRegister returns
// CU_FILE_INTERNAL_BUF_REGISTER_ERROR), read-eio (cuFileRead returns -1
// with errno EIO), driveropen-hang (cuFileDriverOpen never returns, as
// real cuFile on a kernel without /proc/modules); no violation is recorded
// for them. NVFEED_CUFILE_UDEV: where udev's records are read (default
// /run/udev), read at each cuFileHandleRegister.
// CUDA_STANDIN_RDMA=1 (device attribute 110): cuFileBufRegister of memory
// created without gpuDirectRDMACapable fails.
//
// Rules (cufile.h of cuFile 1.15 and the GDS API reference; a violation
// returns the error named and is recorded in libcuda.so.1's report):
//   - A CUDA context: the GDS API reference's usage notes, "APIs with GPU
//     buffers should be called in a valid CUDA context"; cuFileBufRegister,
//     cuFileBufDeregister and cuFileRead without a current context are
//     CU_FILE_INVALID_CONTEXT_ERROR; with the context of another GPU than
//     the memory's, CU_FILE_CUDA_CONTEXT_MISMATCH (STRICTER for
//     cuFileBufRegister, which the real library may accept).
//   - cuFileHandleRegister: CU_FILE_INVALID_FILE_TYPE "if ... not a regular
//     file", CU_FILE_HANDLE_ALREADY_REGISTERED "if file handle/descriptor is
//     already registered". CU_FILE_INVALID_FILE_OPEN_FLAG for an O_NONBLOCK
//     descriptor (libcufile 1.15: "cuFileHandleRegister error, fd opened
//     with unsupported flags: 51200", O_NONBLOCK|O_DIRECT|O_LARGEFILE).
//     STRICTER: before cuFileDriverOpen it is
//     CU_FILE_DRIVER_NOT_INITIALIZED (the real library may open the driver
//     itself). A descriptor without O_DIRECT is accepted, as cuFile >= 1.7
//     does (it opens its own O_DIRECT descriptor).
//   - cuFileBufRegister: CU_FILE_MEMORY_ALREADY_REGISTERED; the range must be
//     mapped, accessible device memory (CU_FILE_CUDA_POINTER_INVALID);
//     gpuDirectRDMACapable when device attribute 110 is 1 (cuda.h:
//     CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, "Device
//     supports specifying the GPUDirect RDMA flag with cuMemCreate"),
//     CU_FILE_INVALID_VALUE. Unmapping registered memory before
//     cuFileBufDeregister is a violation (cuda.c).
//   - cuFileBufDeregister: "CU_FILE_INVALID_VALUE on invalid memory pointer
//     or unregistered memory pointer".
//   - cuFileRead: a registered handle (CU_FILE_HANDLE_NOT_REGISTERED); the
//     destination mapped, accessible device memory (CU_FILE_CUDA_POINTER_INVALID;
//     STRICTER: host buffers, which cuFile accepts, are not modelled); inside
//     its registered buffer when it lies in one (CU_FILE_CUDA_POINTER_RANGE_ERROR).
//     Unregistered buffers work ("the data will be buffered through
//     preallocated pinned buffers"). "-1 on error, in which case errno is
//     set"; other errors are the negated CUfileOpError.
//   - cuFileDriverClose: CU_FILE_DRIVER_CLOSING "if there are any active IO
//     operations"; closing a driver that is not open is a violation.
#define _GNU_SOURCE
#include "standin.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

enum { ALIGN = 4096, CHUNK = 8 << 20, MAX_GPUS = 16 };

struct file {
	int live, fd;
	dev_t dev;
	ino_t ino;
};

struct buf {
	int live, phys;
	uintptr_t base;
	size_t len;
};

static struct {
	pthread_mutex_t mu;
	int compat, fail_bufregister, fail_read_eio, fail_driveropen_hang;
	long open, inflight;
	int stats_level, stats_on;
	struct standin_vec files, bufs;
	CUfileStatsLevel1_t l1;
	CUfilePerGpuStats_t gpu[MAX_GPUS]; // by physical GPU
} cf = {.mu = PTHREAD_MUTEX_INITIALIZER};

__attribute__((constructor)) static void setup(void) {
	const char *m = getenv("CUFILE_STANDIN_MODE");
	cf.compat = m && strcmp(m, "compat") == 0;
	const char *f = getenv("CUFILE_STANDIN_FAIL");
	char buf[256], *save = NULL;
	snprintf(buf, sizeof buf, "%s", f ? f : "");
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		cf.fail_bufregister |= strcmp(t, "bufregister") == 0;
		cf.fail_read_eio |= strcmp(t, "read-eio") == 0;
		cf.fail_driveropen_hang |= strcmp(t, "driveropen-hang") == 0;
	}
}

static void lock(void) { pthread_mutex_lock(&cf.mu); }
static void unlock(void) { pthread_mutex_unlock(&cf.mu); }

static CUfileError_t status(int err) { return (CUfileError_t){.err = err}; }

// fail records a violation and returns err as a CUfileError_t.
#define fail(err, ...) status(standin_violation(err, __VA_ARGS__))

// need_context checks that a context is current: 0, or the error.
static int need_context(const char *call, int *phys) {
	*phys = standin_context();
	if (*phys == -1)
		return standin_violation(CU_FILE_INVALID_CONTEXT_ERROR, "%s: no current CUDA context on the calling thread",
		                         call);
	if (*phys == -2)
		return standin_violation(CU_FILE_INVALID_CONTEXT_ERROR, "%s: the current context is no longer retained",
		                         call);
	return 0;
}

CUfileError_t cuFileDriverOpen(void) {
	if (cf.fail_driveropen_hang) // injected: as real cuFile on a kernel without /proc/modules
		for (;;)
			pause();
	lock();
	cf.open++;
	unlock();
	standin_stat_add(STAT_CUFILE_DRIVER_OPEN, 1);
	return status(CU_FILE_SUCCESS);
}

CUfileError_t cuFileDriverClose_v2(void) {
	lock();
	CUfileError_t r = status(CU_FILE_SUCCESS);
	if (cf.open == 0)
		r = fail(CU_FILE_DRIVER_NOT_INITIALIZED, "cuFileDriverClose: the driver is not open");
	else if (cf.inflight)
		r = fail(CU_FILE_DRIVER_CLOSING, "cuFileDriverClose: %ld cuFileRead calls in flight", cf.inflight);
	else
		cf.open--;
	unlock();
	if (!r.err)
		standin_stat_add(STAT_CUFILE_DRIVER_OPEN, -1);
	return r;
}

CUfileError_t cuFileDriverClose(void) { return cuFileDriverClose_v2(); }

long cuFileUseCount(void) {
	lock();
	long n = cf.open;
	unlock();
	return n;
}

CUfileError_t cuFileGetVersion(int *v) {
	*v = 1150;
	return status(CU_FILE_SUCCESS);
}

CUfileError_t cuFileDriverGetProperties(CUfileDrvProps_t *p) {
	lock();
	CUfileError_t r = status(cf.open ? CU_FILE_SUCCESS : CU_FILE_DRIVER_NOT_INITIALIZED);
	if (!r.err) {
		memset(p, 0, sizeof *p);
		if (!cf.compat) {
			p->nvfs.major_version = 2;
			p->nvfs.minor_version = 26;
			p->nvfs.dstatusflags = 1u << CU_FILE_NVME_SUPPORTED;
		}
		p->nvfs.poll_thresh_size = 4;
		p->nvfs.max_direct_io_size = 16384;
		p->nvfs.dcontrolflags = 1u << CU_FILE_ALLOW_COMPAT_MODE;
		p->max_device_cache_size = 131072;
		p->per_buffer_cache_size = 1024;
		p->max_device_pinned_mem_size = 33554432;
		p->max_batch_io_size = 128;
		p->max_batch_io_timeout_msecs = 5;
	}
	unlock();
	return r;
}

// udev_fs_usage says whether udev's record of block device dev
// (<udev>/data/b<major>:<minor>, <udev> NVFEED_CUFILE_UDEV or /run/udev)
// has ID_FS_USAGE, as real cuFile requires of a file's device.
static int udev_fs_usage(dev_t dev) {
	const char *root = getenv("NVFEED_CUFILE_UDEV");
	char path[4096], line[512];
	snprintf(path, sizeof path, "%s/data/b%u:%u", root && *root ? root : "/run/udev", major(dev), minor(dev));
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	int ok = 0;
	while (!ok && fgets(line, sizeof line, f))
		ok = strncmp(line, "E:ID_FS_USAGE=", 14) == 0 && line[14] && line[14] != '\n';
	fclose(f);
	return ok;
}

CUfileError_t cuFileHandleRegister(CUfileHandle_t *fh, CUfileDescr_t *d) {
	lock();
	CUfileError_t r = status(CU_FILE_SUCCESS);
	struct stat s;
	if (!cf.open)
		r = fail(CU_FILE_DRIVER_NOT_INITIALIZED, "cuFileHandleRegister: cuFileDriverOpen has not been called");
	else if (!fh || !d || d->type != CU_FILE_HANDLE_TYPE_OPAQUE_FD || d->fs_ops)
		r = fail(CU_FILE_INVALID_VALUE, "cuFileHandleRegister: not an OPAQUE_FD descriptor without fs_ops");
	else if (fstat(d->handle.fd, &s) != 0)
		r = fail(CU_FILE_INVALID_VALUE, "cuFileHandleRegister: descriptor %d is not open", d->handle.fd);
	else if (!S_ISREG(s.st_mode))
		r = fail(CU_FILE_INVALID_FILE_TYPE, "cuFileHandleRegister: descriptor %d is not a regular file",
		         d->handle.fd);
	else if (fcntl(d->handle.fd, F_GETFL) & O_NONBLOCK)
		r = fail(CU_FILE_INVALID_FILE_OPEN_FLAG,
		         "cuFileHandleRegister: descriptor %d is O_NONBLOCK (cuFile: \"fd opened with unsupported flags\")",
		         d->handle.fd);
	else if (!udev_fs_usage(s.st_dev))
		r = fail(CU_FILE_HANDLE_NOT_REGISTERED,
		         "cuFileHandleRegister: descriptor %d: udev property not found: ID_FS_USAGE (no udev record "
		         "b%u:%u with it under $NVFEED_CUFILE_UDEV or /run/udev)",
		         d->handle.fd, major(s.st_dev), minor(s.st_dev));
	for (size_t i = 0; !r.err && i < cf.files.n; i++) {
		struct file *f = cf.files.p[i];
		if (f->live && f->fd == d->handle.fd && f->dev == s.st_dev && f->ino == s.st_ino)
			r = fail(CU_FILE_HANDLE_ALREADY_REGISTERED, "cuFileHandleRegister: descriptor %d is already registered",
			         d->handle.fd);
	}
	if (!r.err) {
		struct file *f = calloc(1, sizeof *f);
		*f = (struct file){.live = 1, .fd = d->handle.fd, .dev = s.st_dev, .ino = s.st_ino};
		*fh = (CUfileHandle_t)(uintptr_t)standin_handle(K_CUFILE, standin_push(&cf.files, f));
		cf.l1.hdl_register_ops.ok++;
		standin_live_add(LIVE_CUFILE_HANDLES, 1);
	}
	unlock();
	return r;
}

void cuFileHandleDeregister(CUfileHandle_t fh) {
	lock();
	struct file *f = standin_lookup(&cf.files, K_CUFILE, (uintptr_t)fh);
	if (!f || !f->live) {
		standin_violation(0, "cuFileHandleDeregister: %p is %s", fh,
		                  f ? "already deregistered" : "not a registered file handle");
	} else {
		f->live = 0;
		cf.l1.hdl_deregister_ops.ok++;
		standin_live_add(LIVE_CUFILE_HANDLES, -1);
	}
	unlock();
}

// buf_at returns the live registration containing p.
static struct buf *buf_at(uintptr_t p) {
	for (size_t i = 0; i < cf.bufs.n; i++) {
		struct buf *b = cf.bufs.p[i];
		if (b->live && p >= b->base && p - b->base < b->len)
			return b;
	}
	return NULL;
}

CUfileError_t cuFileBufRegister(const void *base, size_t len, int flags) {
	lock();
	uintptr_t p = (uintptr_t)base;
	int ctx, phys = -1, rdma = 0, bad = 0;
	CUfileError_t r = status(need_context("cuFileBufRegister", &ctx));
	if (!r.err && (!base || !len || flags & ~(CU_FILE_RDMA_REGISTER | CU_FILE_RDMA_RELAXED_ORDERING)))
		r = fail(CU_FILE_INVALID_VALUE, "cuFileBufRegister: pointer %p, length %zu, flags %#x", base, len, flags);
	if (!r.err && (bad = standin_pin(p, len, 1, PIN_REGISTERED, &phys, &rdma)))
		r = fail(CU_FILE_CUDA_POINTER_INVALID, "cuFileBufRegister: [%p, +%zu) is not %s device memory", base, len,
		         bad == STANDIN_NOT_MAPPED ? "mapped" : "accessible (cuMemSetAccess)");
	int pinned = !r.err;
	if (!r.err && phys != ctx)
		r = fail(CU_FILE_CUDA_CONTEXT_MISMATCH,
		         "cuFileBufRegister: the memory is on GPU %d (physical), the current context on GPU %d", phys, ctx);
	for (size_t i = 0; !r.err && i < cf.bufs.n; i++) {
		struct buf *b = cf.bufs.p[i];
		if (b->live && b->base < p + len && p < b->base + b->len)
			r = fail(CU_FILE_MEMORY_ALREADY_REGISTERED, "cuFileBufRegister: [%p, +%zu) overlaps the registered [%#lx, +%zu)",
			         base, len, (unsigned long)b->base, b->len);
	}
	if (!r.err && cf.fail_bufregister)
		r = status(CU_FILE_INTERNAL_BUF_REGISTER_ERROR); // injected
	if (!r.err && standin_rdma() && !rdma)
		r = fail(CU_FILE_INVALID_VALUE,
		         "cuFileBufRegister: memory created without gpuDirectRDMACapable while device attribute 110 "
		         "(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) is 1");
	if (phys >= 0 && phys < MAX_GPUS) {
		cf.gpu[phys].n_mmap++;
		(*(r.err ? &cf.gpu[phys].n_mmap_err : &cf.gpu[phys].n_mmap_ok))++;
	}
	if (r.err && pinned)
		standin_unpin(p, len, PIN_REGISTERED);
	if (!r.err) {
		struct buf *b = calloc(1, sizeof *b);
		*b = (struct buf){.live = 1, .phys = phys, .base = p, .len = len};
		standin_push(&cf.bufs, b);
		cf.gpu[phys].reg_bytes += len;
		cf.l1.buf_register_ops.ok++;
		standin_live_add(LIVE_CUFILE_BUFFERS, 1);
	} else {
		cf.l1.buf_register_ops.err++;
	}
	unlock();
	return r;
}

CUfileError_t cuFileBufDeregister(const void *base) {
	lock();
	int ctx;
	struct buf *b = buf_at((uintptr_t)base);
	CUfileError_t r = status(need_context("cuFileBufDeregister", &ctx));
	if (!r.err && (!b || b->base != (uintptr_t)base))
		r = fail(CU_FILE_INVALID_VALUE, "cuFileBufDeregister: %p is not a registered buffer's base", base);
	if (!r.err) {
		b->live = 0;
		standin_unpin(b->base, b->len, PIN_REGISTERED);
		cf.gpu[b->phys].n_mmap_free++;
		cf.l1.buf_deregister_ops.ok++;
		standin_live_add(LIVE_CUFILE_BUFFERS, -1);
	}
	unlock();
	return r;
}

// read_into reads n bytes at off of fd into dst, through an aligned bounce
// buffer when fd is O_DIRECT and off, n or dst are not 4 KiB-aligned.
// Returns the bytes read (short at the end of the file) or -1 with errno.
static ssize_t read_into(int fd, char *dst, size_t n, off_t off) {
	int direct = (fcntl(fd, F_GETFL) & O_DIRECT) != 0;
	size_t done = 0;
	while (done < n) {
		size_t want = n - done < CHUNK ? n - done : CHUNK;
		off_t at = off + (off_t)done;
		ssize_t got;
		if (!direct || (at % ALIGN == 0 && want % ALIGN == 0 && (uintptr_t)(dst + done) % ALIGN == 0)) {
			got = pread(fd, dst + done, want, at);
		} else {
			off_t start = at / ALIGN * ALIGN;
			size_t head = (size_t)(at - start), span = (head + want + ALIGN - 1) / ALIGN * ALIGN;
			void *bounce;
			if (posix_memalign(&bounce, ALIGN, span) != 0) {
				errno = ENOMEM;
				return -1;
			}
			got = pread(fd, bounce, span, start);
			if (got >= 0) {
				got = got > (ssize_t)head ? got - (ssize_t)head : 0;
				if (got > (ssize_t)want)
					got = (ssize_t)want;
				memcpy(dst + done, (char *)bounce + head, (size_t)got);
			}
			int e = errno;
			free(bounce);
			errno = e;
		}
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return -1;
		done += (size_t)got;
		if (got == 0 || (size_t)got < want)
			break;
	}
	return (ssize_t)done;
}

static void count_read(int phys, ssize_t n) {
	if (!cf.stats_on || cf.stats_level < 1)
		return;
	CUfilePerGpuStats_t *g = phys >= 0 && phys < MAX_GPUS ? &cf.gpu[phys] : NULL;
	if (n < 0) {
		cf.l1.read_ops.err++;
		if (g)
			g->n_reads_err++;
		return;
	}
	cf.l1.read_ops.ok++;
	cf.l1.read_bytes += (uint64_t)n;
	if (g) {
		g->n_total_reads++;
		g->read_bytes += (uint64_t)n;
		(*(cf.compat ? &g->n_posix_reads : &g->n_nvfs_reads))++;
	}
}

ssize_t cuFileRead(CUfileHandle_t fh, void *base, size_t size, off_t file_off, off_t buf_off) {
	lock();
	struct file *f = standin_lookup(&cf.files, K_CUFILE, (uintptr_t)fh);
	uintptr_t dst = (uintptr_t)base + (uintptr_t)buf_off;
	int ctx, phys = -1, err = 0, bad = 0;
	if (!cf.open)
		err = standin_violation(CU_FILE_DRIVER_NOT_INITIALIZED, "cuFileRead: the driver is not open");
	else if (!f || !f->live)
		err = standin_violation(CU_FILE_HANDLE_NOT_REGISTERED, "cuFileRead: %p is %s", fh,
		                        f ? "deregistered (use after release)" : "not a registered file handle");
	else if (file_off < 0 || buf_off < 0)
		err = standin_violation(CU_FILE_INVALID_VALUE, "cuFileRead: negative offset (file %lld, buffer %lld)",
		                        (long long)file_off, (long long)buf_off);
	else
		err = need_context("cuFileRead", &ctx);
	if (!err && (bad = standin_pin(dst, size, 1, PIN_IO, &phys, NULL)))
		err = standin_violation(CU_FILE_CUDA_POINTER_INVALID, "cuFileRead: [%#lx, +%zu) is not %s device memory",
		                        (unsigned long)dst, size,
		                        bad == STANDIN_NOT_MAPPED ? "mapped" : "accessible (cuMemSetAccess)");
	int pinned = !err;
	if (!err && phys != ctx)
		err = standin_violation(CU_FILE_CUDA_CONTEXT_MISMATCH,
		                        "cuFileRead: the memory is on GPU %d (physical), the current context on GPU %d", phys,
		                        ctx);
	struct buf *b = err ? NULL : buf_at((uintptr_t)base);
	if (b && dst + size > b->base + b->len)
		err = standin_violation(CU_FILE_CUDA_POINTER_RANGE_ERROR,
		                        "cuFileRead: [%#lx, +%zu) runs past the registered buffer [%#lx, +%zu)",
		                        (unsigned long)dst, size, (unsigned long)b->base, b->len);
	int fd = f ? f->fd : -1;
	if (!err)
		cf.inflight++;
	unlock();
	standin_stat_add(STAT_CUFILE_READS, 1);
	if (err) {
		if (pinned)
			standin_unpin(dst, size, PIN_IO);
		return -(ssize_t)err;
	}
	ssize_t n;
	if (cf.fail_read_eio) {
		errno = EIO;
		n = -1;
	} else {
		n = read_into(fd, (char *)dst, size, file_off);
	}
	int e = errno;
	standin_unpin(dst, size, PIN_IO);
	lock();
	cf.inflight--;
	count_read(phys, n);
	unlock();
	errno = e;
	return n;
}

CUfileError_t cuFileSetStatsLevel(int level) {
	if (level < 0 || level > 3)
		return fail(CU_FILE_INVALID_VALUE, "cuFileSetStatsLevel: level %d (0 to 3)", level);
	lock();
	cf.stats_level = level;
	unlock();
	return status(CU_FILE_SUCCESS);
}

CUfileError_t cuFileGetStatsLevel(int *level) {
	lock();
	*level = cf.stats_level;
	unlock();
	return status(CU_FILE_SUCCESS);
}

CUfileError_t cuFileStatsStart(void) {
	lock();
	cf.stats_on = 1;
	unlock();
	return status(CU_FILE_SUCCESS);
}

CUfileError_t cuFileStatsStop(void) {
	lock();
	cf.stats_on = 0;
	unlock();
	return status(CU_FILE_SUCCESS);
}

CUfileError_t cuFileStatsReset(void) {
	lock();
	memset(&cf.l1, 0, sizeof cf.l1);
	memset(cf.gpu, 0, sizeof cf.gpu);
	unlock();
	return status(CU_FILE_SUCCESS);
}

CUfileError_t cuFileGetStatsL1(CUfileStatsLevel1_t *s) {
	lock();
	CUfileError_t r = status(cf.stats_level >= 1 ? CU_FILE_SUCCESS : CU_FILE_INVALID_VALUE);
	if (!r.err)
		*s = cf.l1;
	unlock();
	return r;
}

// cuFileGetStatsL3 lists every visible GPU in reverse ordinal order, so
// that a reader matching them by index is wrong and one matching by UUID
// right; in compat mode too, as real cuFile does (libcufile 1.15 lists
// the GPUs, their reads counted as POSIX reads).
CUfileError_t cuFileGetStatsL3(CUfileStatsLevel3_t *s) {
	lock();
	CUfileError_t r = status(cf.stats_level >= 3 ? CU_FILE_SUCCESS : CU_FILE_INVALID_VALUE);
	if (!r.err) {
		memset(s, 0, sizeof *s);
		s->detailed.basic = cf.l1;
		int n = standin_visible_count();
		s->num_gpus = (uint32_t)n;
		for (int i = 0; i < n; i++) {
			int phys = standin_phys(n - 1 - i);
			s->per_gpu_stats[i] = cf.gpu[phys];
			standin_uuid(phys, s->per_gpu_stats[i].uuid);
		}
	}
	unlock();
	return r;
}
