// SPDX-License-Identifier: Apache-2.0

package loader_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/backend/backendtest"
)

// memBackend is a third-party backend written against the public
// contract only (package backend): it holds every sample in memory, read
// once at open (as the caller, with Env.Cred), and copies it into batch
// memory where each request says (Buf[At:]). A sample it could not read
// fails its requests.
type memBackend struct {
	data  [][]byte
	errs  []error // why sample i could not be read
	reads atomic.Int64
}

func (b *memBackend) Name() string { return "mem" }

func (b *memBackend) ReadBatch(ctx context.Context, reqs []backend.Request) error {
	var first error
	for i := range reqs {
		r := &reqs[i]
		r.Err = nil
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := b.errs[r.Index]; err != nil {
			r.Err = &backend.SampleError{Index: r.Index, Path: r.Sample.Path, Err: err}
			first = cmp.Or(first, r.Err)
			continue
		}
		copy(r.Data(), b.data[r.Index])
		b.reads.Add(1)
	}
	return first
}

func (b *memBackend) Stats() backend.Stats {
	return backend.Stats{Engine: "memory", Counters: []backend.Counter{{Name: "samples", Value: b.reads.Load()}}}
}

func (b *memBackend) Close() error { return nil }

// memSpec describes it: the one package's worth of a new backend.
func memSpec() backend.Spec {
	return backend.Spec{Name: "mem", Doc: "samples held in memory (a test)",
		Open: func(m *bmap.Map, _ backend.Params, env backend.Env) (backend.Backend, error) {
			open := func(path string) (int, error) { return unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0) }
			if env.Cred != nil {
				c, err := backend.NewCaller(*env.Cred, 1)
				if err != nil {
					return nil, err
				}
				defer c.Close()
				open = func(path string) (int, error) { return c.Open(path, unix.O_RDONLY) }
			}
			b := &memBackend{data: make([][]byte, len(m.Samples)), errs: make([]error, len(m.Samples))}
			for i, s := range m.Samples {
				b.data[i], b.errs[i] = readSample(open, filepath.Join(m.Root, s.Path), s.Offset, s.Size)
			}
			return b, nil
		}}
}

// readSample reads size bytes at off of the file at path, opened with
// open; a file shorter than that wraps backend.ErrShortRead.
func readSample(open func(string) (int, error), path string, off, size int64) ([]byte, error) {
	fd, err := open(path)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	d := make([]byte, size)
	if _, err := f.ReadAt(d, off); err != nil {
		return nil, fmt.Errorf("%w: %w", backend.ErrShortRead, err)
	}
	return d, nil
}

// TestMemBackendConforms: the in-memory backend passes the conformance
// suite any backend runs.
func TestMemBackendConforms(t *testing.T) {
	backendtest.Run(t, backendtest.Config{Spec: memSpec()})
}

// TestRegisterBackend shows ARCHITECTURE.md's "adding a backend is one
// package and one line": the backend above, added with loader.Register,
// is offered by name and reads batches byte-exact.
func TestRegisterBackend(t *testing.T) {
	if err := loader.Register(memSpec()); err != nil { // the one line
		t.Fatal(err)
	}
	if err := loader.Register(memSpec()); !errors.Is(err, loader.ErrOptions) {
		t.Errorf("registering mem twice: %v, want ErrOptions", err)
	}
	if _, err := loader.BackendSpec("mem"); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	var paths []string
	for i, name := range []string{"a/0.jpg", "a/1.jpg", "b/2.jpg"} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.Repeat([]byte{byte('x' + i)}, 1000+i*4000), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, name)
	}
	m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := loader.New(context.Background(), m, loader.Options{ReaderArgs: loader.ReaderArgs{BatchSize: 2}, Backend: "mem"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	n := 0
	for {
		b, err := l.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < b.Len(); i++ {
			want, _ := os.ReadFile(filepath.Join(root, m.Samples[b.Indices[i]].Path))
			if !bytes.Equal(b.Sample(i), want) {
				t.Errorf("sample %d: bytes differ", b.Indices[i])
			}
			n++
		}
		b.Release()
	}
	if n != len(paths) || l.Backend().Name() != "mem" {
		t.Errorf("read %d samples with %s, want %d with mem", n, l.Backend().Name(), len(paths))
	}
}
