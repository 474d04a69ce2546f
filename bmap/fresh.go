// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/extentinfo"
)

// Checker compares a map with the live filesystem. Create it with
// NewChecker; it is safe for concurrent use.
type Checker struct {
	m      *Map
	dev    extentinfo.Device
	devNum uint64
	rootFd int
}

// NewChecker checks the map's filesystem identity against the filesystem
// now mounted at its root: same type, and the same UUID (or, when either
// UUID is unknown, the same device number). The live device, which may have
// another node or number than when mapped (a re-attached loop device), is
// returned by Device.
func (m *Map) NewChecker() (*Checker, error) {
	live, err := extentinfo.ResolveDevice(m.Root)
	if err != nil {
		return nil, fmt.Errorf("bmap: %w: %w", ErrStale, err)
	}
	want := m.Device
	switch {
	case live.FSType != want.FSType:
		return nil, fmt.Errorf("bmap: %s: %w: filesystem is %s, map was made on %s", m.Root, ErrStale, live.FSType, want.FSType)
	case live.FSUUID != "" && want.FSUUID != "":
		if live.FSUUID != want.FSUUID {
			return nil, fmt.Errorf("bmap: %s: %w: filesystem UUID is %s, map was made on %s", m.Root, ErrStale, live.FSUUID, want.FSUUID)
		}
	case live.Major != want.Major || live.Minor != want.Minor:
		return nil, fmt.Errorf("bmap: %s: %w: device is %d:%d, map was made on %d:%d (UUID unknown)", m.Root, ErrStale, live.Major, live.Minor, want.Major, want.Minor)
	}
	fd, err := unix.Open(m.Root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("bmap: open %s: %w", m.Root, err)
	}
	return &Checker{m: m, dev: live, devNum: unix.Mkdev(live.Major, live.Minor), rootFd: fd}, nil
}

// Device returns the live device of the map's filesystem.
func (c *Checker) Device() extentinfo.Device { return c.dev }

// Check compares sample i with the live file: same filesystem, inode, size
// (Sample.FileSize), modification and change time. Any difference returns an error wrapping
// ErrStale that names the sample and what changed.
func (c *Checker) Check(i int) error {
	_, err := c.CheckLinks(i)
	return err
}

// CheckLinks is Check that also returns the file's link count: a file with
// other hard links can change through paths outside the dataset.
func (c *Checker) CheckLinks(i int) (nlink uint64, err error) {
	s := &c.m.Samples[i]
	var st unix.Stat_t
	if err := unix.Fstatat(c.rootFd, s.Path, &st, 0); err != nil {
		return 0, fmt.Errorf("bmap: sample %d (%s): %w: %w", i, s.Path, ErrStale, err)
	}
	return c.compare(i, &st)
}

// compare checks sample i against st, the file now at its path.
func (c *Checker) compare(i int, st *unix.Stat_t) (nlink uint64, err error) {
	s := &c.m.Samples[i]
	var what string
	switch {
	case s.Reason != OtherFS && st.Dev != c.devNum:
		what = "now on another filesystem"
	case st.Ino != s.Inode:
		what = fmt.Sprintf("inode %d, mapped %d", st.Ino, s.Inode)
	case st.Size != s.FileSize():
		what = fmt.Sprintf("size %d, mapped %d", st.Size, s.FileSize())
	case st.Mtim.Nano() != s.MtimeNs:
		what = "modified since mapped"
	case st.Ctim.Nano() != s.CtimeNs:
		what = "changed since mapped"
	default:
		return uint64(st.Nlink), nil
	}
	return 0, fmt.Errorf("bmap: sample %d (%s): %w: %s", i, s.Path, ErrStale, what)
}

// CheckFd is Check of the file open at fd (opened by whoever must be
// able to open it), and, for a raw sample and a non-nil mp, that the
// extents the map gives for its bytes are the file's own now (FIEMAP with
// mp): a map that names other blocks fails with ErrExtents.
func (c *Checker) CheckFd(i, fd int, mp *extentinfo.Mapper) (nlink uint64, err error) {
	s := &c.m.Samples[i]
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("bmap: sample %d (%s): %w: %w", i, s.Path, ErrStale, err)
	}
	if nlink, err = c.compare(i, &st); err != nil || s.Reason != Raw || mp == nil {
		return nlink, err
	}
	live, err := mp.ExtentsFd(fd, nil)
	if err != nil {
		return 0, fmt.Errorf("bmap: sample %d (%s): %w: FIEMAP: %w", i, s.Path, ErrExtents, err)
	}
	now := Sample{Offset: s.Offset, Size: s.Size, Extents: live}
	if classify(s.Offset, s.Size, live) != Raw || !slices.Equal(s.Segments(nil), now.Segments(nil)) {
		return 0, fmt.Errorf("bmap: sample %d (%s): %w", i, s.Path, ErrExtents)
	}
	return nlink, nil
}

// Verify opens sample i as the process (following links, as Build does)
// and checks it with CheckFd.
func (c *Checker) Verify(i int, mp *extentinfo.Mapper) (nlink uint64, err error) {
	fd, err := c.Open(i)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return c.CheckFd(i, fd, mp)
}

// Open opens sample i's file read-only beneath the map's root, as the
// process (the descriptor Verify checks); the caller closes it. The error
// wraps ErrStale.
func (c *Checker) Open(i int) (int, error) {
	s := &c.m.Samples[i]
	fd, err := unix.Openat(c.rootFd, s.Path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return -1, fmt.Errorf("bmap: sample %d (%s): %w: %w", i, s.Path, ErrStale, err)
	}
	return fd, nil
}

// Close releases the checker's directory handle.
func (c *Checker) Close() error { return unix.Close(c.rootFd) }
