// SPDX-License-Identifier: Apache-2.0

// Package faults injects failures into the built-in backends' reads, as pebble's errorfs does.
// Chosen samples' reads fail with EIO, come back short, or stall; no root needed.
// A test installs a process-wide rule set and each read site asks Inject.
// loaderd's nvfeed_faults build installs one with --inject-eio; release builds cannot.
// With nothing installed, Inject is one atomic load.
package faults

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrInjected is the default error of an injected fault.
var ErrInjected = errors.New("injected fault")

var installed atomic.Pointer[Faults]

// Install makes f the process's faults, replacing any installed, until
// restore is called (restore puts back what was installed before).
func Install(f *Faults) (restore func()) {
	prev := installed.Swap(f)
	return func() { installed.Store(prev) }
}

// Inject returns the fault for a read of kind op of the sample at path
// (relative to the dataset root), if the installed faults have a
// matching rule.
func Inject(op Op, path string) (Fault, bool) {
	return installed.Load().Inject(op, path)
}

// Op names the kind of read a fault rule matches.
type Op uint8

// Read kinds.
const (
	FileRead   Op = 1 << iota // a sample read through the filesystem
	DeviceRead                // a raw read of a sample's extents from the block device
)

// Rule makes matching reads fail, come back short, or stall.
type Rule struct {
	Op    Op            // reads it matches: FileRead, DeviceRead or both
	Path  string        // the sample's path relative to the dataset root; "" matches every sample
	Err   error         // the read fails with this error
	Short bool          // the read returns half of what it got (rounded down to Align for device reads)
	Stall time.Duration // the read completes only after this long
	Times int           // how many reads it hits; 0 means every one
}

// Fault is what a matching rule does to one read.
type Fault struct {
	Err   error
	Short bool
	Stall time.Duration
}

// Faults is a set of rules: the first matching rule with hits left
// applies. A nil *Faults injects nothing. Safe for concurrent use.
type Faults struct {
	mu    sync.Mutex
	rules []Rule
	left  []int // hits left per rule; -1 means unlimited
	hits  int
}

// Add appends a rule.
func (f *Faults) Add(r Rule) *Faults {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, r)
	if r.Times == 0 {
		f.left = append(f.left, -1)
	} else {
		f.left = append(f.left, r.Times)
	}
	return f
}

// Hits returns how many reads faults were injected into.
func (f *Faults) Hits() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits
}

// Inject returns the fault for a read of kind op of the sample at path,
// if a rule matches.
func (f *Faults) Inject(op Op, path string) (Fault, bool) {
	if f == nil {
		return Fault{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.rules {
		if r.Op&op == 0 || (r.Path != "" && r.Path != path) || f.left[i] == 0 {
			continue
		}
		if f.left[i] > 0 {
			f.left[i]--
		}
		f.hits++
		return Fault{Err: r.Err, Short: r.Short, Stall: r.Stall}, true
	}
	return Fault{}, false
}

// Apply returns the result a read that got n bytes with err reports under
// the fault: after the stall, the fault's error, or half the bytes when
// short (rounded down to a multiple of align, when align > 1).
func (ft Fault) Apply(n int, err error, align int) (int, error) {
	if ft.Stall > 0 {
		time.Sleep(ft.Stall)
	}
	if ft.Err != nil {
		return 0, ft.Err
	}
	if ft.Short && err == nil {
		n /= 2
		if align > 1 {
			n -= n % align
		}
	}
	return n, err
}
