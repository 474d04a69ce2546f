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

// Cred is who a backend reads for (Env.Cred): a filesystem uid, gid and
// supplementary groups, as a unix socket's peer had them when it
// connected. Opening as it (NewCaller) makes the kernel judge every open
// as that user's own.
type Cred struct {
	UID, GID uint32
	Groups   []uint32
}

// String names the credentials for messages: "uid 1000 gid 1000 groups
// [4 27]" (internal/cred's form, whose Cred has the same fields).
func (c Cred) String() string { return cred.Cred(c).String() }

// Caller opens files as a Cred on a few threads switched to it (the
// kernel checks each open: mode bits, ACLs, every directory on the
// resolved path; root's capabilities to override permissions do not
// apply), for a backend whose reads run on ordinary goroutines: what is
// read through a descriptor afterwards needs no further check. Safe for
// concurrent use; Close it when done.
type Caller struct{ o *cred.Opener }

// NewCaller starts threads (at least 1) switched to c. The process needs
// the capabilities to switch (CAP_SETUID, CAP_SETGID: the daemon runs as
// root); the error says when the kernel refused.
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

// Open opens path (absolute, or relative to the process's working
// directory) with flags (O_CLOEXEC is added) as the caller's Cred and
// returns the descriptor, the caller's to close.
func (o *Caller) Open(path string, flags int) (int, error) {
	fds, errs := o.OpenAll([]string{path}, flags)
	return fds[0], errs[0]
}

// OpenAll is Open of every path, shared among the caller's threads in one
// hand-off each (handing a switched thread one file at a time costs more
// than the open). fds[i] is -1 where errs[i] is set.
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

// Guard is a map's freshness state (Env.Guard), shared by every backend
// reading the map in one host (the daemon keeps one per dataset; package
// bmap/fresh's Guard is one): which samples may be read from their mapped
// extents, which changed since mapping, and checks of a live file against
// the map. A backend reading only through the filesystem uses it to skip
// the caller's opens where nothing on a sample's path changed.
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
	// RawAllowed reports whether raw sample i may be read from its
	// extents (after each read's checks): neither ChangedAtOpen nor
	// Writable.
	RawAllowed(i int) bool
	// ChangedAtOpen reports whether sample i was found changed when the
	// guard opened: it must not be read raw.
	ChangedAtOpen(i int) bool
	// Writable reports whether raw sample i may be changed by a user the
	// host does not trust: it is never read raw, but through the
	// filesystem as the caller.
	Writable(i int) bool
	// NeedStat reports whether raw sample i must be checked (Check, or
	// CheckFd as the caller) before bytes read from its extents are
	// trusted.
	NeedStat(i int) bool
	// PathUnchanged reports whether nothing on sample i's path under the
	// root changed since the watch began (false with GuardRead): a host
	// that checked the caller's access after that may open it beneath
	// the root as itself, then SameFile.
	PathUnchanged(i int) bool
	// MarkChanged marks sample i changed for good: an open of its path
	// found another file or none. From then on NeedStat and not
	// PathUnchanged.
	MarkChanged(i int)
	// Check stats sample i now; the error wraps bmap.ErrStale if it
	// changed.
	Check(i int) error
	// CheckFd checks sample i against the file open at fd (opened as the
	// caller): identity and times (bmap.ErrStale) and that its extents
	// are the map's (bmap.ErrExtents).
	CheckFd(i, fd int) error
	// SameFile checks that fd is sample i's file as mapped (identity,
	// size, times) without its extents; the error wraps bmap.ErrStale.
	SameFile(i, fd int) error
}

// Shared holds resources several backends share by key, refcounted
// (Env.Shared): the daemon's one io_uring engine per block device for all
// its sessions. A backend prefixes its keys with its name.
type Shared interface {
	// Acquire returns the resource under key, calling open to make it
	// when there is none (open runs under the holder's lock: quick, and
	// no Acquire inside). release gives this reference back; the last
	// release closes the resource and returns Close's error.
	Acquire(key string, open func() (io.Closer, error)) (v io.Closer, release func() error, err error)
}

// ModeCompat is the mode (ModeReporter.Mode) of a backend writing device
// memory through the host anyway (cuFile's compatibility mode: POSIX
// reads into its own bounce buffers, then copies): slower than a bounce
// path's one copy per batch, so GPU path auto takes bounce instead.
const ModeCompat = "compat"

// ModeNone and ModeUnknown are the modes (ModeReporter.Mode) of a backend
// that could not measure how it reaches the device: no read yet, or its
// statistics do not say (they do not list the session's GPU yet). GPU
// path auto takes bounce for them too: it keeps the device writer only
// where it was seen reading directly.
const (
	ModeNone    = "none"
	ModeUnknown = "unknown"
)

// ModeReporter is a backend writing device memory (Spec.DeviceWrites)
// that measures how it reaches the device (Spec.MeasuresMode): the host
// asks once it is open, and under GPU path auto falls back to bounce in
// ModeCompat, ModeNone and ModeUnknown.
type ModeReporter interface {
	// Mode returns how the backend reaches the device ("gds", ModeCompat,
	// "mixed", "none" before any read, "unknown") and why it says so.
	Mode() (mode, why string)
}
