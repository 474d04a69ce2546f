// SPDX-License-Identifier: Apache-2.0

package bmap_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ncw/directio"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// npyBytes is an .npy file as np.save writes it (npy.Encode's header is
// np.save's, byte for byte: see bmap/npy's tests), with random data.
func npyBytes(t testing.TB, rng *rand.Rand, dt npy.DType, shape ...int64) []byte {
	t.Helper()
	h := npy.Header{DType: dt, Shape: shape}
	b, err := npy.Encode(h)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, h.NBytes())
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if dt == npy.Bool {
		for i := range data {
			data[i] &= 1
		}
	}
	return append(b, data...)
}

// npyPadded is an .npy file whose header is padded so that the data
// starts at offset 4096, on a block boundary.
func npyPadded(t testing.TB, rng *rand.Rand, dt npy.DType, n int64) []byte {
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }", dt.Descr(), n)
	hdr := make([]byte, 4096)
	copy(hdr, npy.Magic+"\x01\x00")
	binary.LittleEndian.PutUint16(hdr[8:], 4096-10)
	copy(hdr[10:], dict)
	for i := 10 + len(dict); i < 4095; i++ {
		hdr[i] = ' '
	}
	hdr[4095] = '\n'
	data := make([]byte, n*int64(dt.ItemSize()))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	return append(hdr, data...)
}

// TestNumpyRawReads maps .npy files on real ext4 and xfs and reads every
// raw tensor sample from the block device with O_DIRECT: the bytes are
// the file's past its header, exactly np.load(file)'s bytes (checked with
// numpy itself when the project's virtual environment has it), for small
// arrays inside the header's block, large and fragmented ones, a header
// padded to a whole block, empty and 0-d arrays.
func TestNumpyRawReads(t *testing.T) {
	for _, opts := range []testfs.Options{testfs.Ext4(), testfs.XFS()} {
		t.Run(opts.Type, func(t *testing.T) {
			fs := testfs.New(t, opts)
			rng := rand.New(rand.NewPCG(5, 6))
			files := map[string][]byte{
				"vol/small.npy":      npyBytes(t, rng, npy.Float32, 2, 3),
				"vol/scalar.npy":     npyBytes(t, rng, npy.Int64),
				"vol/empty.npy":      npyBytes(t, rng, npy.Uint16, 0, 4),
				"vol/bool.npy":       npyBytes(t, rng, npy.Bool, 4097),
				"vol/a/c16.npy":      npyBytes(t, rng, npy.Complex128, 3, 100),
				"vol/a/f16.npy":      npyBytes(t, rng, npy.Float16, 8191),
				"vol/a/large.npy":    npyBytes(t, rng, npy.Float32, 3, 512, 700),
				"vol/b/aligned.npy":  npyPadded(t, rng, npy.Int32, 50_000),
				"vol/b/u64_4096.npy": npyBytes(t, rng, npy.Uint64, 512),
			}
			for p, b := range files {
				fs.WriteFile(t, p, b)
			}
			// Fragmented: interleaved with a spacer file.
			frag := npyBytes(t, rng, npy.Float64, 3<<20/8)
			testfs.WriteInterleaved(t, fs, []string{"vol/b/frag.npy", "vol/b/spacer.dat"}, [][]byte{frag, make([]byte, 3<<20)})
			files["vol/b/frag.npy"] = frag
			fs.Sync(t)

			m, err := bmap.Build(context.Background(), fs.Path("vol"), bmap.BuildOptions{Reader: bmap.ReaderNumpy})
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Samples) != len(files) {
				t.Fatalf("%d samples, want %d", len(m.Samples), len(files))
			}
			dev, err := directio.OpenFile(m.Device.Path, os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			r := bmap.RawReader{Dev: dev}
			work := t.TempDir()
			var check []npCheck
			raw, multi := 0, 0
			for i := range m.Samples {
				s := &m.Samples[i]
				file := files["vol/"+s.Path]
				if s.FileSize() != int64(len(file)) || !bytes.Equal(file[:s.Offset][:6], []byte(npy.Magic)) {
					t.Errorf("%s: offset %d size %d, file %d bytes", s.Path, s.Offset, s.Size, len(file))
					continue
				}
				if s.Reason != bmap.Raw {
					if s.Size > 64 || opts.Type != "ext4" {
						t.Errorf("%s (%d bytes): %v, want raw", s.Path, s.FileSize(), s.Reason)
					}
					continue // a file small enough to be inline on ext4
				}
				raw++
				if len(s.Extents) > 1 {
					multi++
				}
				got := make([]byte, s.Size)
				if err := r.ReadSample(s, got); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, file[s.Offset:]) {
					t.Errorf("%s: the device's bytes are not the file's data", s.Path)
				}
				out := filepath.Join(work, fmt.Sprintf("%d.raw", i))
				if err := os.WriteFile(out, got, 0o644); err != nil {
					t.Fatal(err)
				}
				check = append(check, npCheck{File: fs.Path("vol", s.Path), Raw: out, DType: s.Tensor.DType.String(), Shape: s.Tensor.Shape})
			}
			if raw < len(files)-1 || multi == 0 {
				t.Errorf("%d raw samples (%d with several extents) of %d: the test did not test what it says", raw, multi, len(files))
			}
			if s := byPathOf(m, "b/aligned.npy"); s == nil || s.Offset != 4096 {
				t.Errorf("padded header: %+v", s)
			}
			rep, err := bmap.Verify(context.Background(), m, 2)
			if err != nil || rep.Checked != raw || len(rep.Differences) != 0 {
				t.Errorf("verify: %d checked, %v, %v", rep.Checked, rep.Differences, err)
			}
			checkWithNumpy(t, check)
		})
	}
}

func byPathOf(m *bmap.Map, p string) *bmap.Sample {
	for i := range m.Samples {
		if m.Samples[i].Path == p {
			return &m.Samples[i]
		}
	}
	return nil
}

// npCheck asks numpy whether np.load(File) has dtype DType, shape Shape
// and, as bytes, the contents of Raw.
type npCheck struct {
	File  string  `json:"file"`
	Raw   string  `json:"raw"`
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
}

const npCheckScript = `
import json, sys
import numpy as np
bad = []
for c in json.load(sys.stdin):
    a = np.load(c["file"])
    raw = open(c["raw"], "rb").read()
    if a.dtype.name != c["dtype"] or list(a.shape) != (c["shape"] or []) or a.tobytes() != raw:
        bad.append((c["file"], a.dtype.name, a.shape))
print(json.dumps(bad))
`

// checkWithNumpy runs the checks with the project's virtual environment's
// Python, where it has numpy; without it, says so and checks nothing.
func checkWithNumpy(t *testing.T, checks []npCheck) {
	py, _ := filepath.Abs("../.venv/bin/python")
	if _, err := os.Stat(py); err != nil {
		t.Logf("no %s: raw reads compared with the files' bytes only, not with np.load", py)
		return
	}
	in, _ := json.Marshal(checks)
	cmd := exec.Command(py, "-c", npCheckScript)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No module named 'numpy'") {
			t.Logf("no numpy in %s: raw reads compared with the files' bytes only", py)
			return
		}
		t.Fatalf("numpy check: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "[]" {
		t.Errorf("np.load disagrees with the raw reads: %s", got)
	}
	t.Logf("np.load agrees with %d raw reads", len(checks))
}
