// SPDX-License-Identifier: Apache-2.0

package session

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// Status is what the daemon serves and holds now, as one caller may see
// it (Manager.Status): the datasets as Datasets describes them, with why
// their samples are not read raw; the open sessions the caller may see;
// the daemon's budgets and how much of each is used.
type Status struct {
	Datasets []DatasetStatus
	// Sessions: every open session for root on the unix socket; another
	// caller's own only. Sorted by owner, dataset and opening time.
	Sessions []SessionInfo
	Budgets  []Budget
}

// DatasetStatus is a dataset's description and, for a caller who may read
// it, why its raw-mapped samples that are not read raw are not
// (StaleCauses; empty when every one is fresh).
type DatasetStatus struct {
	DatasetInfo
	StaleCauses []StaleCause
}

// Causes of raw-mapped samples read through the filesystem
// (StaleCause.Cause).
const (
	// CauseChanged: the file changed since mapping (its contents, size,
	// times, owner, mode or ACL: a chmod -R or chown -R does it too).
	CauseChanged = "changed_since_mapping"
	// CauseExtents: the mapped extents are not the file's own.
	CauseExtents = "extents_not_the_files"
	// CauseWritable: unchanged, but a user the daemon does not trust may
	// change the file.
	CauseWritable = "writable_by_untrusted_users"
	// CauseUnchecked: no freshness guard could be made for the dataset
	// (its filesystem is not the one mapped, say): every raw sample
	// counts as stale.
	CauseUnchecked = "unchecked"
	// CausePending: the checking pass that runs after registration has
	// not judged them yet; they are read raw once it has.
	CausePending = "not_yet_checked"
)

// StaleCause is how many raw-mapped samples one cause keeps from raw
// reads, and what makes them raw again.
type StaleCause struct {
	Cause   string // CauseChanged, CauseExtents, CauseWritable or CauseUnchecked
	Samples int
	Fix     string
}

// The fixes of the causes (StaleCause.Fix).
const (
	fixRemap     = "map the dataset again (mkbmap), then loaderd reload"
	fixWritable  = "make the files root's and not writable by group or others (chown root; chmod go-w; no ACL granting write), or immutable (chattr +i), or trust their owner (--trusted-uid/--trusted-gid); then loaderd reload"
	fixPending   = "none: the daemon is still checking them after its start (loaderd status shows the progress)"
	fixUnchecked = "mount the filesystem that was mapped at the map's root, or map the dataset again (mkbmap); then loaderd reload"
)

// staleCauses splits info's samples not read raw by cause (info as the
// caller may see it: nothing for one who may not read the dataset).
func staleCauses(info DatasetInfo) []StaleCause {
	if !info.Readable {
		return nil
	}
	var out []StaleCause
	add := func(cause string, n int, fix string) {
		if n > 0 {
			out = append(out, StaleCause{Cause: cause, Samples: n, Fix: fix})
		}
	}
	if info.Freshness == FreshnessUnchecked {
		add(CauseUnchecked, info.Stale, fixUnchecked)
		return out
	}
	add(CauseChanged, info.Stale-info.StaleExtents, fixRemap)
	add(CauseExtents, info.StaleExtents, fixRemap)
	add(CauseWritable, info.Writable, fixWritable)
	add(CausePending, info.Pending, fixPending)
	return out
}

// SessionInfo is one open session as Status tells of it: whose, over
// what, with how much memory. Never its id (what lets its owner drive
// it).
type SessionInfo struct {
	UID          int    // its owner's uid (for TCP, the TCP principal's)
	TCP          bool   // opened over loopback TCP
	Dataset      string //
	Backend      string
	BackendWhy   string // why that backend, when its open named none
	Memory       string // its batch memory's kind: pinned or gpu
	Device       int    // the GPU of gpu memory
	GPUPath      string // for gpu memory: cufile or bounce
	BatchBytes   int64  // batch memory counted against the budgets: page-locked host and GPU memory
	SamplerBytes int64  // sample-order memory counted against its budget
	Opened       time.Time
	Idle         time.Duration // since its last request (0 while it streams)
	Streaming    bool
}

// Budgets (Budget.Name).
const (
	BudgetLocked      = "batch_memory"           // Config.MaxLockedBytes, bytes
	BudgetDevice      = "gpu_batch_memory"       // Config.MaxDeviceBytes, bytes
	BudgetSampler     = "sample_order_memory"    // Config.MaxSamplerBytes, bytes
	BudgetSessions    = "sessions"               // Config.MaxSessions
	BudgetOwnSessions = "sessions_of_the_caller" // Config.MaxSessionsPerUID, for the caller's owner
)

// Budget is one of the daemon's limits and how much of it is used.
type Budget struct {
	Name   string // BudgetLocked, ...
	Used   int64
	Limit  int64
	Source string // where the limit came from (memory budgets: Config.MaxLockedSource, ...); "" for the others
}

// Status tells c what the daemon serves and holds (Status): the
// datasets as Datasets would, the sessions c may see, the budgets. The
// access checks it makes stop when ctx ends.
func (m *Manager) Status(ctx context.Context, c Caller) Status {
	var st Status
	for _, info := range m.Datasets(ctx, c) {
		st.Datasets = append(st.Datasets, DatasetStatus{DatasetInfo: info, StaleCauses: staleCauses(info)})
	}
	root := credOf(c) == nil && !c.TCP
	now := time.Now()
	for _, ss := range m.snapshot() {
		if !root && ss.owner != c.owner() {
			continue
		}
		si := SessionInfo{UID: ss.owner.uid, TCP: ss.owner.tcp, Dataset: ss.dataset, Backend: ss.backend, BackendWhy: ss.backendWhy, Memory: ss.kind, Device: ss.device,
			GPUPath: ss.gpuPath, BatchBytes: ss.reserved.locked + ss.reserved.device, SamplerBytes: ss.reserved.sampler, Opened: ss.opened, Streaming: ss.streaming()}
		if !si.Streaming {
			si.Idle = max(0, now.Sub(time.Unix(0, ss.lastUsed.Load())))
		}
		st.Sessions = append(st.Sessions, si)
	}
	slices.SortFunc(st.Sessions, func(a, b SessionInfo) int {
		return cmp.Or(cmp.Compare(a.UID, b.UID), cmp.Compare(a.Dataset, b.Dataset), a.Opened.Compare(b.Opened))
	})
	m.mu.Lock()
	st.Budgets = []Budget{
		{BudgetLocked, m.locked, m.cfg.MaxLockedBytes, m.cfg.MaxLockedSource},
		{BudgetDevice, m.device, m.cfg.MaxDeviceBytes, m.cfg.MaxDeviceSource},
		{BudgetSampler, m.samplers, m.cfg.MaxSamplerBytes, m.cfg.MaxSamplerSource},
		{BudgetSessions, int64(len(m.sessions) + m.opening), int64(m.cfg.MaxSessions), "--max-sessions"},
		{BudgetOwnSessions, int64(m.perOwner[c.owner()]), int64(m.cfg.MaxSessionsPerUID), "--max-sessions-per-uid"},
	}
	m.mu.Unlock()
	return st
}
