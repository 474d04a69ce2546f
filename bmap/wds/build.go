// SPDX-License-Identifier: Apache-2.0

package wds

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
)

// ErrIndex is wrapped by the error of an index file (DALI's index_paths,
// made by wds2idx) that is malformed or disagrees with its tar.
var ErrIndex = errors.New("webdataset index file")

// ErrNoShards is returned (wrapped) by Build for a root without .tar
// files or an empty list.
var ErrNoShards = errors.New("no tar shards")

// BuildOptions configures Build.
type BuildOptions struct {
	// Paths are the shards, in this order (DALI's paths), relative to the
	// root or absolute inside it; nil: the root's .tar files (Discover).
	Paths []string
	// IndexPaths, when not nil, are DALI's index_paths: one wds2idx
	// index per shard, whose samples are then the index's (each
	// component checked against the tar's member at its offset).
	IndexPaths []string
	// Workers map the shards' extents in parallel; 0: bmap's default.
	Workers int
	// RequireExtents refuses a filesystem without device extents.
	RequireExtents bool
}

// Stats summarize a built map.
type Stats struct {
	Shards, Samples, Components int
	Bytes                       int64 // the components' bytes
}

// Discover lists the .tar files directly in root, sorted bytewise as
// DALI's paths are meant to be given (a regular file or a link to one).
func Discover(root string) ([]string, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("wds: %w", err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".tar") {
			continue
		}
		if st, err := os.Stat(filepath.Join(root, e.Name())); err == nil && st.Mode().IsRegular() {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	if len(out) == 0 {
		return nil, fmt.Errorf("wds: %s: %w (no .tar file in it)", root, ErrNoShards)
	}
	return out, nil
}

// Build maps root's tar shards into the webdataset map at out: each
// shard's extents (bmap.Build of the tars as a listed map), then its
// samples as fn.readers.webdataset forms them (ReadTar, GroupMembers;
// or the shard's index), every member's component kept: extensions are
// chosen when the map is opened (Map.Select). Memory: one shard's
// members at a time.
func Build(ctx context.Context, root, out string, o BuildOptions) (Stats, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return Stats{}, fmt.Errorf("wds: %w", err)
	}
	paths := o.Paths
	if paths == nil {
		if paths, err = Discover(abs); err != nil {
			return Stats{}, err
		}
	}
	if len(paths) == 0 {
		return Stats{}, fmt.Errorf("wds: %s: %w: the list is empty", abs, ErrNoShards)
	}
	if o.IndexPaths != nil && len(o.IndexPaths) != len(paths) {
		return Stats{}, fmt.Errorf("wds: %w: %d index files for %d archives (DALI: the number of index files, if any, must match)", ErrIndex, len(o.IndexPaths), len(paths))
	}
	entries := make([]bmap.Entry, len(paths))
	for i, p := range paths {
		entries[i] = bmap.Entry{Path: p}
	}
	shards, err := bmap.Build(ctx, abs, bmap.BuildOptions{Files: entries, Workers: o.Workers, RequireExtents: o.RequireExtents})
	if err != nil {
		return Stats{}, fmt.Errorf("wds: %w", err)
	}
	w, err := NewWriter(out)
	if err != nil {
		return Stats{}, err
	}
	defer w.Abort()
	st := Stats{Shards: len(paths)}
	for i := range shards.Samples {
		if err := ctx.Err(); err != nil {
			return Stats{}, err
		}
		idx := ""
		if o.IndexPaths != nil {
			idx = o.IndexPaths[i]
		}
		if err := addShard(w, abs, i, &shards.Samples[i], idx, &st); err != nil {
			return Stats{}, err
		}
	}
	if err := w.Close(shards); err != nil {
		return Stats{}, err
	}
	return st, nil
}

// addShard reads shard i's members and writes its samples.
func addShard(w *Writer, root string, i int, s *bmap.Sample, index string, st *Stats) error {
	name := filepath.Join(root, s.Path)
	f, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("wds: %w", err)
	}
	defer f.Close()
	var fs unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &fs); err != nil {
		return fmt.Errorf("wds: %s: %w", name, err)
	}
	if fs.Ino != s.Inode || fs.Size != s.Size {
		return fmt.Errorf("wds: %s: %w: changed while mapping", name, bmap.ErrStale)
	}
	members, err := ReadTar(bufferedAt{f}, s.Size, name)
	if err != nil {
		return fmt.Errorf("wds: %w", err)
	}
	w.Shard(i)
	var names []string
	var offs, sizes []int64
	add := func(key string) error {
		st.Samples++
		st.Components += len(names)
		for _, n := range sizes {
			st.Bytes += n
		}
		err := w.Sample(key, names, offs, sizes)
		names, offs, sizes = names[:0], offs[:0], sizes[:0]
		return err
	}
	if index != "" {
		return readIndex(index, name, members, func(comps []int) error {
			for _, j := range comps {
				names = append(names, members[j].Name)
				offs = append(offs, members[j].Offset)
				sizes = append(sizes, members[j].Size)
			}
			key, _ := SplitName(members[comps[0]].Name)
			return add(key)
		})
	}
	groups, comps := GroupMembers(members)
	for _, g := range groups {
		for _, j := range comps[g.First : g.First+g.Count] {
			names = append(names, members[j].Name)
			offs = append(offs, members[j].Offset)
			sizes = append(sizes, members[j].Size)
		}
		if err := add(g.Key); err != nil {
			return err
		}
	}
	return nil
}

// readIndex reads a wds2idx index (v1.1: "ext offset size" per component,
// v1.2: "ext offset size filename") and calls sample with each line's
// components as member indices, each checked: a member's data at that
// offset, of that size and extension.
func readIndex(path, tar string, members []Member, sample func(comps []int) error) error {
	at := make(map[int64]int, len(members))
	for j, m := range members {
		at[m.Offset] = j
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("wds: %w: %w", ErrIndex, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<26)
	bad := func(line int, format string, a ...any) error {
		return fmt.Errorf("wds: %w: malformed index file at %q line %d - %s", ErrIndex, path, line, fmt.Sprintf(format, a...))
	}
	if !sc.Scan() {
		return bad(0, "no version signature found")
	}
	head := strings.Fields(sc.Text())
	if len(head) < 1 || (head[0] != "v1.1" && head[0] != "v1.2") {
		return bad(0, "unsupported version of the index file (%q)", strings.Join(head, " "))
	}
	per := 3
	if head[0] == "v1.2" {
		per = 4
	}
	if len(head) < 2 {
		return bad(0, "no sample count found")
	}
	n, err := strconv.ParseInt(head[1], 10, 64)
	if err != nil || n <= 0 {
		return bad(0, "sample count must be positive")
	}
	comps := make([]int, 0, 8)
	for line := int64(1); line <= n; line++ {
		if !sc.Scan() {
			return bad(int(line), "%d samples announced, %d found", n, line-1)
		}
		tok := strings.Fields(sc.Text())
		if len(tok) == 0 || len(tok)%per != 0 {
			return bad(int(line), "every record should look like `<ext> <offset> <size>%s`", map[bool]string{true: " <filename>"}[per == 4])
		}
		comps = comps[:0]
		for k := 0; k < len(tok); k += per {
			off, err1 := strconv.ParseInt(tok[k+1], 10, 64)
			size, err2 := strconv.ParseInt(tok[k+2], 10, 64)
			if err1 != nil || err2 != nil || off%BlockSize != 0 {
				return bad(int(line), "offset %q or size %q (the offset a multiple of %d)", tok[k+1], tok[k+2], BlockSize)
			}
			j, ok := at[off]
			if !ok || members[j].Size != size {
				return bad(int(line), "no member of %s with %d bytes of data at %d: the index is not this tar's", tar, size, off)
			}
			if _, ext := SplitName(members[j].Name); ext != tok[k] {
				return bad(int(line), "extension %q, the member at %d is %q", tok[k], off, members[j].Name)
			}
			comps = append(comps, j)
		}
		if err := sample(comps); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("wds: %w: %s: %w", ErrIndex, path, err)
	}
	return nil
}

// bufferedAt reads a file's headers through pread; members' data are
// never read.
type bufferedAt struct{ f *os.File }

func (b bufferedAt) ReadAt(p []byte, off int64) (int, error) { return b.f.ReadAt(p, off) }
