// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"errors"
	"fmt"

	"github.com/nvfeed/nvfeed/bmap"
)

// ErrNoFile is wrapped by the errors of a sample whose file Members
// cannot name (a corrupt record): it is never read raw.
var ErrNoFile = errors.New("sample has no file")

// Members answers a guard's per-sample questions for a dataset whose
// samples are byte ranges of shared files — a webdataset's tar members
// (bmap/wds): the guard is opened on the files (a map listing one
// sample per file, wds.Map.Shards), and sample i's answers are its
// file's, File(i). A file is checked whole, so a tar rewritten,
// replaced, truncated or appended fails every one of its members (never
// stale bytes), and a change the watch sees to one tar makes each of its
// members need its stat. The dataset-wide methods (Poll, Generation,
// Counts, Linked, Map, Close) are the guard's, about its files.
type Members struct {
	*Guard
	// File returns sample i's file, an index into the guard's map, or
	// -1 when it cannot say (the sample is then never fresh).
	File func(i int) int
}

// file returns sample i's file, or -1.
func (m Members) file(i int) int {
	f := m.File(i)
	if f < 0 || f >= len(m.Guard.m.Samples) {
		return -1
	}
	return f
}

func (m Members) noFile(i int) error {
	return fmt.Errorf("fresh: sample %d: %w: %w", i, ErrNoFile, bmap.ErrStale)
}

// ChangedAtOpen reports whether sample i's file was found changed by the
// guard's checking pass.
func (m Members) ChangedAtOpen(i int) bool {
	f := m.file(i)
	return f < 0 || m.Guard.ChangedAtOpen(f)
}

// Writable reports whether an untrusted user may change sample i's file.
func (m Members) Writable(i int) bool {
	f := m.file(i)
	return f < 0 || m.Guard.Writable(f)
}

// RawAllowed reports whether sample i may be read raw.
func (m Members) RawAllowed(i int) bool {
	f := m.file(i)
	return f >= 0 && m.Guard.RawAllowed(f)
}

// Check stats sample i's file against the map (bmap.ErrStale if it
// changed).
func (m Members) Check(i int) error {
	f := m.file(i)
	if f < 0 {
		return m.noFile(i)
	}
	return m.Guard.Check(f)
}

// CheckFd checks fd, sample i's file opened, against the map.
func (m Members) CheckFd(i, fd int) error {
	f := m.file(i)
	if f < 0 {
		return m.noFile(i)
	}
	return m.Guard.CheckFd(f, fd)
}

// SameFile checks that fd is sample i's file as mapped.
func (m Members) SameFile(i, fd int) error {
	f := m.file(i)
	if f < 0 {
		return m.noFile(i)
	}
	return m.Guard.SameFile(f, fd)
}

// NeedStat reports whether sample i, read raw, must be stat'ed before its
// bytes are trusted (its file's answer; always for an unknown file).
func (m Members) NeedStat(i int) bool {
	f := m.file(i)
	return f < 0 || m.Guard.NeedStat(f)
}

// PathUnchanged reports whether nothing on sample i's file's path has
// changed since the watch began.
func (m Members) PathUnchanged(i int) bool {
	f := m.file(i)
	return f >= 0 && m.Guard.PathUnchanged(f)
}

// MarkChanged marks sample i's file changed for good: every sample of
// that file.
func (m Members) MarkChanged(i int) {
	if f := m.file(i); f >= 0 {
		m.Guard.MarkChanged(f)
	}
}
