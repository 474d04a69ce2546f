// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/extentinfo"
)

// BuildOptions configures Build.
type BuildOptions struct {
	DiscoverOptions
	// Reader is the DALI reader the map is for: ReaderFile (the zero
	// value) or ReaderNumpy.
	Reader Reader
	// Files, when not nil, are the samples in order, as DALI's file_list or files and labels.
	// Paths are relative to the root or absolute inside it.
	Files    []Entry
	Workers  int                   // parallel mappers; 0 means 4 per CPU
	Progress func(done, total int) // called as samples are mapped (from several goroutines)
	// RequireExtents refuses a filesystem without device extents (one
	// extentinfo.ResolveDevice refuses) instead of mapping its samples as
	// filesystem-only (NoExtents).
	RequireExtents bool
}

// ErrNoFiles is returned (wrapped) by Build for a numpy root with no file
// the filter matches, or an empty list.
var ErrNoFiles = errors.New("no files")

// Build lists root's samples as DALI's reader does and maps each with FIEMAP.
//
//   - ReaderFile: the folder layout (Discover), or o.Files with their labels.
//   - ReaderNumpy: DiscoverNumpy's files or o.Files. A sample is the array's data.
//     A file not exactly a supported .npy header and C-order data fails, wrapping npy's sentinel.
//     ErrDALIHeader marks a header numpy reads but fn.readers.numpy does not.
//
// A listed path must lie inside root. The map gets its lowest version.
// A filesystem without device extents maps every sample NoExtents, for the file backend.
// o.RequireExtents refuses such a filesystem instead.
// A root without DALI's layout fails with ErrLayout; no file or an empty list with ErrNoFiles.
// A file that cannot be opened or mapped fails the build, named.
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
	classes, entries, err := o.samples(abs)
	if err != nil {
		return nil, err
	}
	m := &Map{Root: abs, Device: dev, Reader: o.Reader, Listed: o.Files != nil, Classes: classes, Samples: make([]Sample, len(entries))}
	if d := o.DiscoverOptions; o.Files == nil && (d.FileFilter != "" || d.CaseSensitive || d.Filters != nil) {
		m.Discovery = &DiscoverOptions{FileFilter: d.FileFilter, CaseSensitive: d.CaseSensitive, Filters: slices.Clone(d.Filters)}
	}
	for i, e := range entries {
		m.Samples[i] = Sample{Path: e.Path, Label: e.Label}
	}
	if err := m.mapSamples(ctx, o.Workers, o.Progress); err != nil {
		return nil, err
	}
	m.Version = m.MinVersion()
	return m, nil
}

// samples lists the samples Build maps under root: o.Files made relative
// and clean, or what DALI's reader finds under root.
func (o *BuildOptions) samples(root string) (classes []string, entries []Entry, err error) {
	if o.Reader >= numReaders {
		return nil, nil, fmt.Errorf("bmap: unknown reader %d", o.Reader)
	}
	if o.Files != nil {
		if len(o.Files) == 0 {
			return nil, nil, fmt.Errorf("bmap: %s: %w: the list is empty", root, ErrNoFiles)
		}
		entries = make([]Entry, len(o.Files))
		for i, e := range o.Files {
			where := fmt.Sprintf("entry %d", i+1)
			if e.Line > 0 {
				where = fmt.Sprintf("line %d", e.Line)
			}
			p, err := ListedPath(root, e.Path)
			if err != nil {
				return nil, nil, fmt.Errorf("bmap: %s: list %s %q: %w: %v", root, where, e.Path, ErrFileList, err)
			}
			if o.Reader == ReaderNumpy && e.Label != 0 {
				return nil, nil, fmt.Errorf("bmap: %s: list %s %q: label %d: numpy samples have no labels", root, where, e.Path, e.Label)
			}
			entries[i] = Entry{Path: p, Label: e.Label, Line: e.Line}
		}
		return nil, entries, nil
	}
	if o.Reader == ReaderNumpy {
		entries, err := DiscoverNumpy(root, o.FileFilter)
		if err == nil && len(entries) == 0 {
			f := o.FileFilter
			if f == "" {
				f = DefaultNumpyFilter
			}
			err = fmt.Errorf("bmap: %s: %w matching %q directly in it or in its immediate subdirectories (fn.readers.numpy looks no deeper)", root, ErrNoFiles, f)
		}
		return nil, entries, err
	}
	classes, entries, err = Discover(root, o.DiscoverOptions)
	if err == nil && len(entries) == 0 {
		err = layoutError(root, classes, o.DiscoverOptions)
	}
	return classes, entries, err
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
	tensors := m.Reader == ReaderNumpy

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
					if err := mapOne(rootFd, devNum, fsOnly, tensors, &mp, &m.Samples[i]); err != nil {
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

// mapOne stats s, reads its .npy header when tensors, and unless fsOnly
// maps its extents.
func mapOne(rootFd int, devNum uint64, fsOnly, tensors bool, mp *extentinfo.Mapper, s *Sample) error {
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
	if tensors {
		h, err := npy.Read(fdReader(fd))
		if err == nil {
			err = h.CheckFile(st.Size)
		}
		if err == nil {
			err = checkDALIHeader(fdReader(fd), h)
		}
		if err != nil {
			return err
		}
		s.Offset, s.Size = h.DataOffset, h.NBytes()
		s.Tensor = &Tensor{DType: h.DType}
		if len(h.Shape) > 0 {
			s.Tensor.Shape = h.Shape
		}
	}
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
	s.Reason = classify(s.Offset, s.Size, exts)
	return nil
}

// fdReader reads a file descriptor with pread.
type fdReader int

// ReadAt implements io.ReaderAt.
func (fd fdReader) ReadAt(b []byte, off int64) (int, error) {
	n := 0
	for n < len(b) {
		k, err := unix.Pread(int(fd), b[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if k == 0 {
			return n, io.EOF
		}
		n += k
	}
	return n, nil
}
