// SPDX-License-Identifier: Apache-2.0

// Command thirdparty is a backend written in a module of its own, as a
// third party would write one: it imports only nvfeed's public packages,
// registers its backend with loader.Register and reads one epoch of the
// dataset at -root as the caller -uid/-gid (loader.Options.Cred, which
// reaches the backend as backend.Env.Cred). It prints one line per
// sample: "PATH ok" or "PATH error: WHY".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// preadBackend reads each sample with pread from its file, opened as the
// caller.
type preadBackend struct {
	m      *bmap.Map
	caller *backend.Caller // nil: as the process
	n      int64
}

func (b *preadBackend) Name() string { return "thirdparty" }

func (b *preadBackend) ReadBatch(ctx context.Context, reqs []backend.Request) error {
	var first error
	for i := range reqs {
		r := &reqs[i]
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.Err = b.read(r); r.Err != nil && first == nil {
			first = r.Err
		}
	}
	return first
}

// read reads r's sample into r.Data().
func (b *preadBackend) read(r *backend.Request) error {
	path := filepath.Join(b.m.Root, r.Sample.Path)
	var f *os.File
	if b.caller != nil {
		fd, err := b.caller.Open(path, os.O_RDONLY)
		if err != nil {
			return &backend.SampleError{Index: r.Index, Path: r.Sample.Path, Err: fmt.Errorf("open as %v: %w", b.caller.Cred(), err)}
		}
		f = os.NewFile(uintptr(fd), path)
	} else {
		var err error
		if f, err = os.Open(path); err != nil {
			return &backend.SampleError{Index: r.Index, Path: r.Sample.Path, Err: err}
		}
	}
	defer f.Close()
	if _, err := f.ReadAt(r.Data(), r.Sample.Offset); err != nil {
		return &backend.SampleError{Index: r.Index, Path: r.Sample.Path, Err: fmt.Errorf("%w: %w", backend.ErrShortRead, err)}
	}
	b.n++
	return nil
}

func (b *preadBackend) Stats() backend.Stats {
	return backend.Stats{Counters: []backend.Counter{{Name: "samples", Value: b.n}}}
}

func (b *preadBackend) Close() error {
	if b.caller != nil {
		b.caller.Close()
	}
	return nil
}

func spec() backend.Spec {
	return backend.Spec{Name: "thirdparty", Doc: "pread as the caller, from another module",
		Open: func(m *bmap.Map, _ backend.Params, env backend.Env) (backend.Backend, error) {
			b := &preadBackend{m: m}
			if env.Cred != nil {
				var err error
				if b.caller, err = backend.NewCaller(*env.Cred, 1); err != nil {
					return nil, err
				}
			}
			return b, nil
		}}
}

func main() {
	root := flag.String("root", "", "the dataset")
	uid := flag.Uint("uid", 0, "the caller's uid")
	gid := flag.Uint("gid", 0, "the caller's gid")
	flag.Parse()
	if err := run(*root, uint32(*uid), uint32(*gid)); err != nil {
		fmt.Fprintln(os.Stderr, "thirdparty:", err)
		os.Exit(1)
	}
}

func run(root string, uid, gid uint32) error {
	if err := loader.Register(spec()); err != nil {
		return err
	}
	m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{})
	if err != nil {
		return err
	}
	l, err := loader.New(context.Background(), m, loader.Options{ReaderArgs: loader.ReaderArgs{BatchSize: len(m.Samples)},
		Backend: "thirdparty", Cred: &backend.Cred{UID: uid, GID: gid}, SkipErrors: true})
	if err != nil {
		return err
	}
	defer l.Close()
	b, err := l.Next(context.Background())
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	failed := map[int]error{}
	for k, pos := range b.Failed {
		failed[pos] = b.Errors[k]
	}
	for i := range b.Len() {
		path := m.Samples[b.Indices[i]].Path
		if err := failed[i]; err != nil {
			fmt.Printf("%s error: %v\n", path, err)
		} else {
			fmt.Printf("%s ok %q\n", path, b.Sample(i))
		}
	}
	b.Release()
	return nil
}
