// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/extentinfo"
)

// BuildOptions configures Build.
type BuildOptions struct {
	DiscoverOptions
	Workers  int                   // parallel mappers; 0 means 4 per CPU
	Progress func(done, total int) // called as samples are mapped (from several goroutines)
	// RequireExtents refuses a filesystem without device extents (one
	// extentinfo.ResolveDevice refuses) instead of mapping its samples as
	// filesystem-only (NoExtents).
	RequireExtents bool
}

// Build discovers root's samples and maps each with FIEMAP. On a
// filesystem whose FIEMAP addresses are not offsets on one block device
// (extentinfo.ResolveDevice refuses it: tmpfs, NFS, overlay, btrfs, …) it
// maps nothing and marks every sample NoExtents, filesystem-only: the map
// then has no Device.Path (see Map.FSOnly), and only the file backend
// reads it. With o.RequireExtents it refuses such a filesystem instead,
// before looking at any file. A root without DALI's layout (no class
// folder, or no sample in them) fails with ErrLayout saying what it found.
// A file that cannot be opened or mapped fails the whole build with an
// error naming it.
func Build(ctx context.Context, root string, o BuildOptions) (*Map, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("bmap: %s: %w", root, err)
	}
	dev, err := extentinfo.ResolveDevice(abs)
	if err != nil && (o.RequireExtents || !errors.Is(err, extentinfo.ErrUnsupportedFS)) {
		return nil, fmt.Errorf("bmap: %w", err)
	}
	fsOnly := err != nil
	if fsOnly {
		if dev, err = fsOnlyDevice(abs); err != nil {
			return nil, err
		}
	}
	classes, entries, err := Discover(abs, o.DiscoverOptions)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, layoutError(abs, classes, o.DiscoverOptions)
	}
	m := &Map{Version: Version, Root: abs, Device: dev, Classes: classes, Samples: make([]Sample, len(entries))}
	for i, e := range entries {
		m.Samples[i] = Sample{Path: e.Path, Label: e.Label}
	}
	if err := m.mapSamples(ctx, o.Workers, o.Progress); err != nil {
		return nil, err
	}
	return m, nil
}

// fsOnlyDevice describes a filesystem without device extents: its type
// and device number (for the freshness checks), no device path.
func fsOnlyDevice(root string) (extentinfo.Device, error) {
	fstype, err := extentinfo.FSType(root)
	if err != nil {
		return extentinfo.Device{}, fmt.Errorf("bmap: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return extentinfo.Device{}, fmt.Errorf("bmap: stat %s: %w", root, err)
	}
	return extentinfo.Device{Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev), FSType: fstype}, nil
}

// FSOnly reports whether the map was made on a filesystem without device
// extents: every sample is filesystem-only (NoExtents or OtherFS) and no
// raw backend can read it.
func (m *Map) FSOnly() bool { return m.Device.Path == "" }

// mapSamples fills extents, stat fields and reasons of every sample.
func (m *Map) mapSamples(ctx context.Context, workers int, progress func(done, total int)) error {
	if workers <= 0 {
		workers = 4 * runtime.NumCPU()
	}
	rootFd, err := unix.Open(m.Root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bmap: open %s: %w", m.Root, err)
	}
	defer unix.Close(rootFd)
	devNum := unix.Mkdev(m.Device.Major, m.Device.Minor)
	fsOnly := m.FSOnly()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next, done atomic.Int64
	const chunk = 64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mp extentinfo.Mapper
			for ctx.Err() == nil {
				lo := int(next.Add(chunk)) - chunk
				if lo >= len(m.Samples) {
					return
				}
				hi := min(lo+chunk, len(m.Samples))
				for i := lo; i < hi; i++ {
					if err := mapOne(rootFd, devNum, fsOnly, &mp, &m.Samples[i]); err != nil {
						cancel(fmt.Errorf("bmap: %s: %w", filepath.Join(m.Root, m.Samples[i].Path), err))
						return
					}
				}
				d := done.Add(int64(hi - lo))
				if progress != nil {
					progress(int(d), len(m.Samples))
				}
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

// mapOne stats s and, unless fsOnly, maps its extents.
func mapOne(rootFd int, devNum uint64, fsOnly bool, mp *extentinfo.Mapper, s *Sample) error {
	// O_NONBLOCK: a symlink to a FIFO must not hang the build.
	fd, err := unix.Openat(rootFd, s.Path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return errNotRegular
	}
	s.Size, s.Inode = st.Size, st.Ino
	s.MtimeNs, s.CtimeNs = st.Mtim.Nano(), st.Ctim.Nano()
	if st.Dev != devNum {
		s.Reason = OtherFS
		return nil
	}
	if fsOnly {
		s.Reason = NoExtents
		return nil
	}
	exts, err := mp.ExtentsFd(fd, nil)
	if err != nil {
		return err
	}
	s.Extents = exts
	s.Reason = classify(s.Size, exts)
	return nil
}
