// SPDX-License-Identifier: Apache-2.0

package backend

import (
	"fmt"
	"io"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/internal/cred"
)

// Cred is who a backend reads for: a filesystem uid, gid and groups.
type Cred struct {
	UID, GID uint32
	Groups   []uint32
}

// String names the credentials for messages: "uid 1000 gid 1000 groups
// [4 27]" (internal/cred's form, whose Cred has the same fields).
func (c Cred) String() string { return cred.Cred(c).String() }

// Caller opens files as a Cred on a few threads switched to it, so the kernel checks each open.
// Safe for concurrent use; Close it when done.
type Caller struct{ o *cred.Opener }

// NewCaller starts threads switched to c; the process needs CAP_SETUID and CAP_SETGID.
func NewCaller(c Cred, threads int) (*Caller, error) {
	c.Groups = slices.Clone(c.Groups)
	o, err := cred.NewOpener(cred.Cred(c), threads)
	if err != nil {
		return nil, fmt.Errorf("backend: opening as %v: %w", c, err)
	}
	return &Caller{o: o}, nil
}

// Cred returns who the caller is.
func (o *Caller) Cred() Cred {
	c := Cred(o.o.Cred())
	c.Groups = slices.Clone(c.Groups)
	return c
}

// Open opens path with flags as the Cred and returns the descriptor; O_CLOEXEC is added.
func (o *Caller) Open(path string, flags int) (int, error) {
	fds, errs := o.OpenAll([]string{path}, flags)
	return fds[0], errs[0]
}

// OpenAll is Open of every path, shared among the threads; fds[i] is -1 where errs[i] is set.
func (o *Caller) OpenAll(paths []string, flags int) (fds []int, errs []error) {
	return o.o.OpenatAll(unix.AT_FDCWD, paths, flags)
}

// Close stops the caller's threads. No Open may be running or follow.
func (o *Caller) Close() { o.o.Close() }

// How a Guard catches changes after it opened (Guard.Method).
const (
	GuardWatch = "watch" // inotify and fanotify: only a sample whose path or inode saw a change is stat'ed again
	GuardRead  = "read"  // every raw sample is stat'ed after its read
)

// Guard is a map's freshness state, shared by every backend reading it in one host.
// It says which samples may be read raw and checks live files against the map.
type Guard interface {
	// Map returns the guarded map: a backend checks it is the one it reads.
	Map() *bmap.Map
	// Device returns the filesystem's block device.
	Device() extentinfo.Device
	// Method returns GuardWatch or GuardRead.
	Method() string
	// Poll takes in the changes seen so far; call it before a batch's
	// plans and after its raw reads complete.
	Poll()
	// RawAllowed reports whether raw sample i may be read from its extents.
	RawAllowed(i int) bool
	// ChangedAtOpen reports whether sample i was found changed when the
	// guard opened: it must not be read raw.
	ChangedAtOpen(i int) bool
	// Writable reports whether raw sample i may be changed by an untrusted user.
	Writable(i int) bool
	// NeedStat reports whether raw sample i must be checked before its raw bytes are trusted.
	NeedStat(i int) bool
	// PathUnchanged reports whether nothing on sample i's path changed since the watch began.
	PathUnchanged(i int) bool
	// MarkChanged marks sample i changed for good: its path led elsewhere.
	MarkChanged(i int)
	// Check stats sample i now; the error wraps bmap.ErrStale if it
	// changed.
	Check(i int) error
	// CheckFd checks sample i against fd, opened as the caller: identity, times and extents.
	CheckFd(i, fd int) error
	// SameFile checks that fd is sample i's file as mapped (identity,
	// size, times) without its extents; the error wraps bmap.ErrStale.
	SameFile(i, fd int) error
}

// Shared holds resources backends share by key, refcounted; keys start with the backend's name.
type Shared interface {
	// Acquire returns the resource under key, made by open when there is none.
	// open runs under the lock and must be quick. The last release closes it.
	Acquire(key string, open func() (io.Closer, error)) (v io.Closer, release func() error, err error)
}

// ModeCompat is the mode of a device writer going through the host anyway.
// It is slower than bounce, so GPU path auto takes bounce instead.
const ModeCompat = "compat"

// ModeNone and ModeUnknown say a backend could not yet tell how it reaches the device.
// GPU path auto takes bounce for them too.
const (
	ModeNone    = "none"
	ModeUnknown = "unknown"
)

// ModeReporter is a device writer that measures how it reaches the device.
// Under GPU path auto the host falls back to bounce in ModeCompat, ModeNone and ModeUnknown.
type ModeReporter interface {
	// Mode returns how the backend reaches the device ("gds", ModeCompat,
	// "mixed", "none" before any read, "unknown") and why it says so.
	Mode() (mode, why string)
}
