// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"

	"github.com/nvfeed/nvfeed/extentinfo"
)

// The xNVMe DALI example's block map: a JSON object from
// "<root base name>/<class>/<file>" to {"startblock": s, "endblock": e}, an
// inclusive range of 512-byte blocks on the whole disk. It can only express
// one extent per file, so it holds only the samples xnvmeRange accepts.
//
// The range is what the example's own generator (get_extent_info.py, from
// xfs_bmap) gives: the file's first extent in whole filesystem blocks, not
// trimmed to the file's size. The example's reader issues commands of 8
// sectors (NLB=7) and refuses a range that is not a multiple of them, and it
// trims nothing: DALI gets block-padded buffers from it.

// xnvmeSectors is the granularity of the example's reads: 8 sectors.
const xnvmeSectors = 8

// xnvmeRange returns s's inclusive 512-byte block range on the whole disk, if the example can read it.
func xnvmeRange(s *Sample, partStart uint64) (start, end uint64, ok bool) {
	if s.Reason != Raw || s.Size <= 0 {
		return 0, 0, false
	}
	n := 0
	for _, e := range s.Extents {
		if e.Logical < uint64(s.Size) {
			n++
		}
	}
	if n != 1 {
		return 0, 0, false
	}
	e := s.Extents[0]
	if e.Logical != 0 || e.Length < uint64(s.Size) || e.Flags&extentinfo.FlagUnwritten != 0 {
		return 0, 0, false
	}
	sectors := e.Length / 512
	if e.Length%512 != 0 || sectors%xnvmeSectors != 0 {
		return 0, 0, false
	}
	start = (partStart + e.Physical) / 512
	return start, start + sectors - 1, true
}

type xnvmeEntry struct {
	Startblock *uint64 `json:"startblock"`
	Endblock   *uint64 `json:"endblock"`
}

// WriteXNVMe writes the samples of m that fit the xNVMe format, keyed with
// the root's base name as prefix, in map order. It returns how many samples
// were left out. A numpy map is refused: the format has whole files only.
func WriteXNVMe(w io.Writer, m *Map) (left int, err error) {
	if m.Reader != ReaderFile {
		return 0, fmt.Errorf("bmap: xnvme-json holds whole files of fn.readers.file datasets, not %s samples (its reader would serve the .npy headers)", m.Reader)
	}
	bw := bufio.NewWriter(w)
	prefix := filepath.Base(m.Root) + "/"
	bw.WriteString("{")
	sep := "\n"
	for i := range m.Samples {
		s := &m.Samples[i]
		start, end, ok := xnvmeRange(s, m.Device.PartitionStart)
		if !ok {
			left++
			continue
		}
		key, _ := json.Marshal(prefix + s.Path)
		fmt.Fprintf(bw, "%s  %s: {\"startblock\": %d, \"endblock\": %d}", sep, key, start, end)
		sep = ",\n"
	}
	bw.WriteString("\n}\n")
	if err := bw.Flush(); err != nil {
		return left, fmt.Errorf("bmap: write xnvme-json: %w", err)
	}
	return left, nil
}

// ImportReport says how an xNVMe map compared with the filesystem.
type ImportReport struct {
	Entries    int // entries in the xNVMe map
	Matched    int // entries equal to what FIEMAP reports now
	Mismatched int // entries that disagree: those samples are marked Mismatch
	Unknown    int // entries naming no discovered sample
	Unlisted   int // discovered samples the xNVMe map does not list (mapped afresh)
}

// ImportXNVMe reads an xNVMe map for root, maps the dataset afresh and checks every entry.
// An entry that disagrees is marked Mismatch, read through the filesystem.
func ImportXNVMe(ctx context.Context, b []byte, root string, o BuildOptions) (*Map, ImportReport, error) {
	var entries map[string]xnvmeEntry
	if err := json.Unmarshal(b, &entries); err != nil {
		return nil, ImportReport{}, fmt.Errorf("%w: xnvme-json: %v", ErrCorrupt, err)
	}
	for k, e := range entries {
		if e.Startblock == nil || e.Endblock == nil || *e.Endblock < *e.Startblock {
			return nil, ImportReport{}, fmt.Errorf("%w: xnvme-json: entry %q: need startblock <= endblock", ErrCorrupt, k)
		}
	}
	m, err := Build(ctx, root, o)
	if err != nil {
		return nil, ImportReport{}, err
	}
	rep := ImportReport{Entries: len(entries)}
	prefix := filepath.Base(m.Root) + "/"
	for i := range m.Samples {
		s := &m.Samples[i]
		e, ok := entries[prefix+s.Path]
		if !ok {
			rep.Unlisted++
			continue
		}
		start, end, fits := xnvmeRange(s, m.Device.PartitionStart)
		// Older exports ended at the last sector holding data; the
		// example's generator ends at the extent's last block. Anything
		// between is this extent; anything else disagrees.
		dataEnd := start + (uint64(s.Size)+511)/512 - 1
		if fits && *e.Startblock == start && *e.Endblock >= dataEnd && *e.Endblock <= end {
			rep.Matched++
		} else {
			rep.Mismatched++
			if s.Reason == Raw {
				s.Reason = Mismatch
			}
		}
	}
	rep.Unknown = rep.Entries - rep.Matched - rep.Mismatched
	return m, rep, nil
}
