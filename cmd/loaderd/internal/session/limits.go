// SPDX-License-Identifier: Apache-2.0

package session

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/confine"
)

// Defaults of Config: a zero field takes its default. loaderd's flags
// show these.
const (
	DefaultSessionTimeout    = 60 * time.Second
	DefaultMaxSessionBytes   = 16 << 30 // batch memory of one session
	DefaultMaxSessions       = 64       // open sessions, every user together
	DefaultMaxSessionsPerUID = 16       // open sessions of one owner (a uid, or the TCP principal)
	// DefaultLockedShare is the share of MemTotal all batch memory may take by default.
	// Page-locked memory is never swapped.
	DefaultLockedShare = 0.5
	// DefaultMaxDeviceBytes is Config.MaxDeviceBytes's default: the GPU
	// batch memory of all sessions together, every GPU (a session's is
	// its slots, rounded up to batchmem.Granularity).
	DefaultMaxDeviceBytes = 16 << 30
)

// DefaultMaxChecksPerUID is Config.MaxChecksPerUID's default: one
// whole-dataset access check of an owner at a time (each opens up to every
// sample of a dataset as the caller, seconds of CPU at a million).
const DefaultMaxChecksPerUID = 1

// DefaultMaxReplaysPerUID is a quarter of the usable CPUs, at least 1.
// A replay keeps a core busy for up to tens of seconds.
func DefaultMaxReplaysPerUID() int { return max(1, runtime.GOMAXPROCS(0)/4) }

// DaemonReserve is what a cgroup limit keeps for the daemon outside every budget.
// It is MinDaemonReserve, or DaemonReserveShare of the limit where more.
// Batch memory is page-locked and never reclaimed, so budgets plus the daemon must fit.
// Else the kernel kills the daemon rather than refusing a session.
const (
	MinDaemonReserve   = 256 << 20
	DaemonReserveShare = 0.125
)

// MemoryEnv is what the daemon's memory budgets default from: the
// machine's memory, its memory cgroup's limit, and RLIMIT_MEMLOCK where
// that binds.
type MemoryEnv struct {
	Total   int64         // MemTotal in bytes; 0: unknown
	Cgroup  confine.Limit // the tightest memory cgroup limit; Bytes 0: none
	Memlock int64         // RLIMIT_MEMLOCK when finite and the daemon lacks CAP_IPC_LOCK; 0: does not bind
}

// ReadMemoryEnv reads this process's MemoryEnv; what it cannot read it
// leaves zero and names in the error, which is for the log.
func ReadMemoryEnv() (MemoryEnv, error) {
	var env MemoryEnv
	var errs []error
	total, err := memTotal()
	if err != nil {
		errs = append(errs, fmt.Errorf("machine memory: %w", err))
	}
	env.Total = total
	if env.Cgroup, err = confine.MemoryLimit("/"); err != nil {
		errs = append(errs, fmt.Errorf("memory cgroup: %w", err))
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err == nil && rl.Cur != unix.RLIM_INFINITY && !hasIPCLock() {
		env.Memlock = int64(min(rl.Cur, uint64(1<<62)))
	}
	if len(errs) > 0 {
		return env, fmt.Errorf("session: reading the daemon's memory limits: %w", errors.Join(errs...))
	}
	return env, nil
}

// BudgetDefault is a budget's default and where it came from.
type BudgetDefault struct {
	Bytes  int64
	Source string // for the log, status and refusals
}

// Reserve returns what the cgroup limit keeps for the daemon itself
// (DaemonReserve); 0 without a limit.
func (e MemoryEnv) Reserve() int64 {
	if e.Cgroup.Bytes == 0 {
		return 0
	}
	return max(MinDaemonReserve, int64(float64(e.Cgroup.Bytes)*DaemonReserveShare))
}

// pool returns what the cgroup limit leaves the budgets, and whether a
// limit is known.
func (e MemoryEnv) pool() (int64, bool) {
	if e.Cgroup.Bytes == 0 {
		return 0, false
	}
	return max(0, e.Cgroup.Bytes-e.Reserve()), true
}

// cgroupSource names the cgroup limit and the reserve taken from it.
func (e MemoryEnv) cgroupSource() string {
	return fmt.Sprintf("%s less %d MiB kept for the daemon itself", e.Cgroup, e.Reserve()>>20)
}

// Sampler returns the default sample-order budget: DefaultSamplerShare
// of MemTotal, or of what the cgroup limit leaves the budgets where
// that is less; DefaultSamplerBytesUnknown without either.
func (e MemoryEnv) Sampler() BudgetDefault {
	b := BudgetDefault{DefaultSamplerBytesUnknown, "unknown machine memory"}
	if e.Total > 0 {
		b = BudgetDefault{int64(float64(e.Total) * DefaultSamplerShare), fmt.Sprintf("%.1f%% of MemTotal (%d MiB)", DefaultSamplerShare*100, e.Total>>20)}
	}
	if pool, ok := e.pool(); ok {
		if n := int64(float64(pool) * DefaultSamplerShare); n < b.Bytes {
			b = BudgetDefault{n, fmt.Sprintf("%.1f%% of %s", DefaultSamplerShare*100, e.cgroupSource())}
		}
	}
	return b
}

// Locked returns the default page-locked budget: DefaultLockedShare of MemTotal.
// It is no more than the cgroup leaves beside sampler, nor RLIMIT_MEMLOCK; else 1<<62.
func (e MemoryEnv) Locked(sampler int64) BudgetDefault {
	b := BudgetDefault{1 << 62, "unknown machine memory"}
	if e.Total > 0 {
		b = BudgetDefault{int64(float64(e.Total) * DefaultLockedShare), fmt.Sprintf("%.0f%% of MemTotal (%d MiB)", DefaultLockedShare*100, e.Total>>20)}
	}
	if pool, ok := e.pool(); ok {
		if n := max(0, pool-sampler); n < b.Bytes {
			b = BudgetDefault{n, fmt.Sprintf("%s and %d MiB of sample-order budget", e.cgroupSource(), sampler>>20)}
		}
	}
	if e.Memlock > 0 && e.Memlock < b.Bytes {
		b = BudgetDefault{e.Memlock, fmt.Sprintf("RLIMIT_MEMLOCK (%d MiB; the daemon has no CAP_IPC_LOCK)", e.Memlock>>20)}
	}
	return b
}

// Overcommit warns when the given budgets and the daemon's reserve pass the cgroup limit.
// It returns "" when they fit or no limit is known.
func (e MemoryEnv) Overcommit(locked, sampler int64) string {
	pool, ok := e.pool()
	if !ok || locked+sampler <= pool {
		return ""
	}
	return fmt.Sprintf("session: the batch memory budget (%d MiB) and the sample-order budget (%d MiB) pass %s (%d MiB): "+
		"sessions within them can get the daemon killed by the kernel (OOM) instead of refused; lower --max-locked-mb or --max-sampler-mb, or raise the limit",
		locked>>20, sampler>>20, e.cgroupSource(), pool>>20)
}

// memTotal returns /proc/meminfo's MemTotal in bytes.
func memTotal() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: MemTotal: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
}

// hasIPCLock says whether the process's effective capabilities hold
// CAP_IPC_LOCK (mlock beyond RLIMIT_MEMLOCK).
func hasIPCLock() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<unix.CAP_IPC_LOCK) != 0
		}
	}
	return false
}

// DefaultSamplerShare is the share of memory all sessions' sample orders may take by default.
// It is of MemTotal or of what the cgroup leaves; without either, DefaultSamplerBytesUnknown.
const (
	DefaultSamplerShare        = 0.125
	DefaultSamplerBytesUnknown = 4 << 30
)

// freeOSAfter: a closed session whose sample order held at least this
// much has its memory returned to the OS (osFreer); smaller ones wait for
// the runtime's own scavenger.
const freeOSAfter = 8 << 20

// freeOSEvery bounds how often osFreer runs debug.FreeOSMemory (a full
// collection, stopping the world for a moment).
const freeOSEvery = time.Second

// osFreer returns freed heap to the OS soon after a large session closes, at most once per freeOSEvery.
// The scavenger alone takes minutes. Its zero value is ready.
type osFreer struct {
	mu      sync.Mutex
	last    time.Time // under mu: the last run
	pending bool      // under mu: a run is scheduled
}

// soon runs debug.FreeOSMemory in the background now, or once
// freeOSEvery has passed since the last run; calls meanwhile share it.
func (f *osFreer) soon() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending {
		return
	}
	f.pending = true
	wait := max(0, freeOSEvery-time.Since(f.last))
	time.AfterFunc(wait, func() {
		f.mu.Lock()
		f.pending, f.last = false, time.Now()
		f.mu.Unlock()
		debug.FreeOSMemory()
	})
}
