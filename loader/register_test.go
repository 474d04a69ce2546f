// SPDX-License-Identifier: Apache-2.0

package loader_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// memBackend is a third-party backend written against the public
// contract only (package backend): it holds every sample in memory,
// read once at open, and copies it into batch memory.
type memBackend struct {
	data  [][]byte
	reads atomic.Int64
}

func (b *memBackend) Name() string { return "mem" }

func (b *memBackend) ReadBatch(ctx context.Context, reqs []backend.Request) error {
	for i := range reqs {
		copy(reqs[i].Buf, b.data[reqs[i].Index])
		b.reads.Add(1)
	}
	return ctx.Err()
}

func (b *memBackend) Stats() backend.Stats {
	return backend.Stats{Engine: "memory", Counters: []backend.Counter{{Name: "samples", Value: b.reads.Load()}}}
}

func (b *memBackend) Close() error { return nil }

// memSpec describes it: the one package's worth of a new backend.
func memSpec() backend.Spec {
	return backend.Spec{Name: "mem", Doc: "samples held in memory (a test)",
		Open: func(m *bmap.Map, _ backend.Params, _ backend.Env) (backend.Backend, error) {
			b := &memBackend{}
			for _, s := range m.Samples {
				d, err := os.ReadFile(filepath.Join(m.Root, s.Path))
				if err != nil {
					return nil, err
				}
				b.data = append(b.data, d)
			}
			return b, nil
		}}
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
