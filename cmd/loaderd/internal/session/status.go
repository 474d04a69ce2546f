// SPDX-License-Identifier: Apache-2.0

package session

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// Status is what the daemon serves and holds now, as one caller may see it.
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
