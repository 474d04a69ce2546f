// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// headerRewrite is a numpy dataset one of whose .npy files had its header
// rewritten in place after mapping, the file keeping its size.
type headerRewrite struct {
	name string
	m    *bmap.Map
	what string // what the failed sample's error names
}

// headerRewrites maps, on fs, three datasets of four float32 (32,) arrays
// and rewrites sample 1's header of each: another dtype, another shape,
// and a longer header moving the data offset (its shape (16,) then).
func headerRewrites(t *testing.T, fs *testfs.FS) []headerRewrite {
	enc := func(h npy.Header, data []byte) []byte {
		b, err := npy.Encode(h)
		if err != nil {
			t.Fatal(err)
		}
		return append(b, data...)
	}
	data := bytes.Repeat([]byte("DATA-128"), 16) // 128 bytes: 32 f32
	orig := npy.Header{DType: npy.Float32, Shape: []int64{32}}
	// A longer header: many unit dimensions make it so.
	long := npy.Header{DType: npy.Float32, Shape: []int64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 16}}
	var out []headerRewrite
	for _, c := range []struct {
		name    string
		rewrite []byte
		what    string
	}{
		{"dtype", enc(npy.Header{DType: npy.Int32, Shape: []int64{32}}, data), "dtype"},
		{"shape", enc(npy.Header{DType: npy.Float32, Shape: []int64{4, 8}}, data), "shape"},
		{"data offset", enc(long, data[:64]), "data at offset"},
	} {
		dir := "t-" + strings.ReplaceAll(c.name, " ", "-")
		for i := range 4 {
			fs.WriteFile(t, fmt.Sprintf("%s/%d.npy", dir, i), enc(orig, data))
		}
		if n := len(enc(orig, data)); len(c.rewrite) != n {
			t.Fatalf("%s: the rewrite is %d bytes, the file %d", c.name, len(c.rewrite), n)
		}
		fs.Sync(t)
		m, err := bmap.Build(context.Background(), fs.Path(dir), bmap.BuildOptions{Reader: bmap.ReaderNumpy})
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(filepath.Join(m.Root, m.Samples[rewrittenSample].Path), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(c.rewrite, 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
		fs.Sync(t)
		out = append(out, headerRewrite{c.name, m, c.what})
	}
	return out
}

// rewrittenSample is the sample whose header headerRewrites rewrites.
const rewrittenSample = 1

// checkHeaderRewritten reads an epoch of r's dataset with o (SkipErrors):
// the rewritten sample must fail, saying its header changed, and be
// served with no byte.
func checkHeaderRewritten(t *testing.T, r headerRewrite, o Options) {
	t.Helper()
	o.ReaderArgs, o.SkipErrors = ReaderArgs{BatchSize: 4}, true
	l, err := New(context.Background(), r.m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	failed := 0
	errs := eachBatch(l, func(b *Batch) {
		for pos, idx := range b.Indices {
			if idx == rewrittenSample && b.Lengths[pos] != 0 {
				t.Errorf("the rewritten sample was served: %d bytes", b.Lengths[pos])
			}
		}
		for _, e := range b.Errors {
			failed++
			if !errors.Is(e, bmap.ErrStale) || !strings.Contains(e.Error(), "header changed since mapping") || !strings.Contains(e.Error(), r.what) {
				t.Errorf("error %v: want ErrStale, the header changed, %q", e, r.what)
			}
		}
	})
	if len(errs) > 0 || failed != 1 {
		t.Errorf("%d failed samples (want 1), errors %v", failed, errs)
	}
}

// TestTensorHeaderRewritten: a .npy whose header is rewritten in place,
// the file keeping its size, is never served with the map's old dtype,
// shape or data offset: file reads it and gds and bam (the file changed:
// read through the filesystem) fail it, saying the header changed since
// mapping, and serve no byte of it.
func TestTensorHeaderRewritten(t *testing.T) {
	for _, r := range headerRewrites(t, testfs.New(t, testfs.Ext4())) {
		for _, be := range []struct {
			name string
			opts map[string]any
		}{{"file", nil}, {"file", map[string]any{"direct": true}}, {"gds", nil}, {"bam", nil}} {
			t.Run(fmt.Sprintf("%s/%s %v", r.name, be.name, be.opts), func(t *testing.T) {
				checkHeaderRewritten(t, r, Options{Backend: be.name, BackendOptions: be.opts})
			})
		}
	}
}

// TestTensorHeaderRewrittenStandin: the same into GPU memory over the
// strict CUDA stand-in, with the real cufile backend (cuFileRead from the
// map's data offset) and bounce through the file backend.
func TestTensorHeaderRewrittenStandin(t *testing.T) {
	if !standin.InChild(t) {
		return
	}
	for _, r := range headerRewrites(t, testfs.New(t, testfs.Ext4())) {
		for _, path := range []string{GPUPathCuFile, GPUPathBounce} {
			t.Run(r.name+"/"+path, func(t *testing.T) {
				o := Options{Memory: batchmem.GPU, GPUPath: path}
				if path == GPUPathBounce {
					o.Backend, o.BackendOptions = "file", map[string]any{"direct": true}
				}
				standin.ProvideCuFileHost(t, false, r.m.Root)
				checkHeaderRewritten(t, r, o)
			})
		}
	}
}
