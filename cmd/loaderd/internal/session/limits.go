// SPDX-License-Identifier: Apache-2.0

package session

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults of Config: a zero field takes its default. loaderd's flags
// show these.
const (
	DefaultSessionTimeout    = 60 * time.Second
	DefaultMaxSessionBytes   = 16 << 30 // batch memory of one session
	DefaultMaxSessions       = 64       // open sessions, every user together
	DefaultMaxSessionsPerUID = 16       // open sessions of one owner (a uid, or the TCP principal)
	// DefaultLockedShare is the share of the machine's memory (MemTotal)
	// that all sessions' batch memory together may take when
	// Config.MaxLockedBytes is not given: page-locked memory is never
	// swapped, so what it takes the rest of the machine loses.
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

// DefaultMaxReplaysPerUID is Config.MaxReplaysPerUID's default: a
// quarter of the CPUs this process may use, at least 1. A replay (a
// shuffle dali session resumed or moved to an epoch: every epoch before
// it is gone through again, up to loader.MaxReplaySamples samples) keeps
// a core busy for up to tens of seconds.
func DefaultMaxReplaysPerUID() int { return max(1, runtime.GOMAXPROCS(0)/4) }

// DefaultMaxLockedBytes is the default budget of batch memory across all
// sessions: DefaultLockedShare of MemTotal, and no more than the
// process's RLIMIT_MEMLOCK when that binds it (finite, and the process
// lacks CAP_IPC_LOCK, which root has and which lifts the limit). It
// returns why, for the log.
func DefaultMaxLockedBytes() (int64, string, error) {
	total, err := memTotal()
	if err != nil {
		return 0, "", fmt.Errorf("session: default batch memory budget: %w", err)
	}
	budget := int64(float64(total) * DefaultLockedShare)
	why := fmt.Sprintf("%.0f%% of MemTotal (%d MiB)", DefaultLockedShare*100, total>>20)
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err == nil && rl.Cur != unix.RLIM_INFINITY && !hasIPCLock() {
		if lim := int64(min(rl.Cur, uint64(1<<62))); lim < budget {
			budget = lim
			why = fmt.Sprintf("RLIMIT_MEMLOCK (%d MiB; the daemon has no CAP_IPC_LOCK)", lim>>20)
		}
	}
	return budget, why, nil
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

// DefaultSamplerShare is the share of the machine's memory (MemTotal) that
// all sessions' sample orders may take when Config.MaxSamplerBytes is not
// given; without /proc/meminfo, DefaultSamplerBytesUnknown.
const (
	DefaultSamplerShare        = 0.125
	DefaultSamplerBytesUnknown = 4 << 30
)

// DefaultMaxSamplerBytes is the default budget of sample-order memory
// across all sessions (loader.SamplerBytes), and why.
func DefaultMaxSamplerBytes() (int64, string) {
	total, err := memTotal()
	if err != nil {
		return DefaultSamplerBytesUnknown, fmt.Sprintf("unknown machine memory: %v", err)
	}
	return int64(float64(total) * DefaultSamplerShare), fmt.Sprintf("%.1f%% of MemTotal (%d MiB)", DefaultSamplerShare*100, total>>20)
}

// freeOSAfter: a closed session whose sample order held at least this
// much has its memory returned to the OS (osFreer); smaller ones wait for
// the runtime's own scavenger.
const freeOSAfter = 8 << 20

// freeOSEvery bounds how often osFreer runs debug.FreeOSMemory (a full
// collection, stopping the world for a moment).
const freeOSEvery = time.Second

// osFreer returns freed heap to the OS soon after a large session
// closes, at most once per freeOSEvery: the runtime's scavenger alone
// takes minutes to give back a closed shuffle dali session's 72 MiB.
// Its zero value is ready.
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
