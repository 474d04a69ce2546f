// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ncw/directio"
)

// Difference is a raw sample whose device bytes differ from its file bytes,
// or could not be read.
type Difference struct {
	Index  int    // sample index
	Path   string // sample path
	Offset int64  // first differing byte of the sample's bytes, or -1 when the read itself failed
	Err    error  // the read error, if any
}

// String describes the difference.
func (d Difference) String() string {
	if d.Err != nil {
		return fmt.Sprintf("%s: %v", d.Path, d.Err)
	}
	return fmt.Sprintf("%s: device bytes differ from file bytes at offset %d", d.Path, d.Offset)
}

// VerifyReport is the result of Verify.
type VerifyReport struct {
	Checked     int          // raw samples read and compared
	Bytes       int64        // their bytes
	Differences []Difference // samples that differ, in index order
}

// Verify reads every raw sample of m from the live device with O_DIRECT
// and compares it with a read through the filesystem (a tensor's data
// with the file's bytes past its header). Samples changed since
// mapping are reported as mismatches (their old extents are not read).
func Verify(ctx context.Context, m *Map, workers int) (VerifyReport, error) {
	return VerifyProgress(ctx, m, workers, nil)
}

// VerifyProgress is Verify calling progress (when not nil, from several
// goroutines) as raw samples are checked, with the number of raw samples
// as total.
func VerifyProgress(ctx context.Context, m *Map, workers int, progress func(done, total int)) (VerifyReport, error) {
	total := 0
	for i := range m.Samples {
		if m.Samples[i].Reason == Raw {
			total++
		}
	}
	ck, err := m.NewChecker()
	if err != nil {
		return VerifyReport{}, err
	}
	defer ck.Close()
	dev, err := directio.OpenFile(ck.Device().Path, os.O_RDONLY, 0)
	if err != nil {
		return VerifyReport{}, fmt.Errorf("bmap: verify: open device: %w", err)
	}
	defer dev.Close()
	if workers <= 0 {
		workers = 2 * runtime.NumCPU()
	}
	var (
		rep  VerifyReport
		mu   sync.Mutex
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r RawReader
			r.Dev = dev
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(m.Samples) {
					return
				}
				s := &m.Samples[i]
				if s.Reason != Raw {
					continue
				}
				d := verifyOne(ck, &r, m, i)
				mu.Lock()
				rep.Checked++
				rep.Bytes += s.Size
				if d != nil {
					rep.Differences = append(rep.Differences, *d)
				}
				done := rep.Checked
				mu.Unlock()
				if progress != nil {
					progress(done, total)
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	slices.SortFunc(rep.Differences, func(a, b Difference) int { return a.Index - b.Index })
	return rep, nil
}

func verifyOne(ck *Checker, r *RawReader, m *Map, i int) *Difference {
	s := &m.Samples[i]
	if err := ck.Check(i); err != nil {
		return &Difference{Index: i, Path: s.Path, Offset: -1, Err: err}
	}
	want, err := os.ReadFile(filepath.Join(m.Root, s.Path))
	if err != nil {
		return &Difference{Index: i, Path: s.Path, Offset: -1, Err: err}
	}
	want = want[min(int64(len(want)), s.Offset):] // a tensor's data, past its header
	got := make([]byte, s.Size)
	if err := r.ReadSample(s, got); err != nil {
		return &Difference{Index: i, Path: s.Path, Offset: -1, Err: err}
	}
	if !bytes.Equal(got, want) {
		off := 0
		for off < len(got) && off < len(want) && got[off] == want[off] {
			off++
		}
		return &Difference{Index: i, Path: s.Path, Offset: int64(off)}
	}
	return nil
}

// RawReader reads raw samples from the filesystem's device opened with
// O_DIRECT, one synchronous aligned pread per segment. It is the simple,
// obviously-correct reference; the loader's backends are the fast path.
// A RawReader is not safe for concurrent use.
type RawReader struct {
	Dev  *os.File  // the device, opened with O_DIRECT
	segs []Segment // scratch
	buf  []byte    // aligned scratch
}

// rawAlign is the alignment of O_DIRECT offsets, lengths and buffers; 4 KiB
// satisfies every logical block size up to 4 KiB.
const rawAlign = 4096

// ReadSample reads all s.Size bytes of raw sample s into dst: the file's
// bytes from s.Offset (a tensor's data, without its header).
func (r *RawReader) ReadSample(s *Sample, dst []byte) error {
	if int64(len(dst)) != s.Size {
		return fmt.Errorf("bmap: %s: buffer is %d bytes, sample is %d", s.Path, len(dst), s.Size)
	}
	r.segs = s.Segments(r.segs[:0])
	for _, g := range r.segs {
		out := dst[g.FileOff : g.FileOff+g.Len]
		if g.Zero {
			clear(out)
			continue
		}
		lo := g.DevOff &^ (rawAlign - 1)
		hi := (g.DevOff + g.Len + rawAlign - 1) &^ (rawAlign - 1)
		if need := int(hi - lo); len(r.buf) < need {
			r.buf = directio.AlignedBlock(need)
		}
		b := r.buf[:hi-lo]
		n, err := r.Dev.ReadAt(b, int64(lo))
		if uint64(n) < g.DevOff+g.Len-lo {
			if err == nil {
				err = fmt.Errorf("short read")
			}
			return fmt.Errorf("bmap: %s: device %s bytes [%d,%d): %w", s.Path, r.Dev.Name(), g.DevOff, g.DevOff+g.Len, err)
		}
		copy(out, b[g.DevOff-lo:])
	}
	return nil
}
