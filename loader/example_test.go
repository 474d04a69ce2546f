// SPDX-License-Identifier: Apache-2.0

package loader_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
)

// writeFolders writes a DALI folder dataset under root: two classes of
// three files each, file i holding i+1 bytes.
func writeFolders(root string) error {
	for i := range 6 {
		dir := filepath.Join(root, fmt.Sprintf("class%d", i%2))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.jpg", i)), make([]byte, i+1), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Example maps a folder dataset, plans a loader over it, reads one epoch
// and resumes from a saved state. docs/loader.md shows this code.
func Example() {
	ctx := context.Background()
	root, err := os.MkdirTemp("", "nvfeed-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)
	if err := writeFolders(root); err != nil {
		log.Fatal(err)
	}

	// Map the dataset as mkbmap does. A map is usually loaded from its
	// file with bmap.Load.
	m, err := bmap.Build(ctx, root, bmap.BuildOptions{})
	if err != nil {
		log.Fatal(err)
	}

	// Plan first: every option checked, the memory known before any is
	// allocated. A daemon admits plan.Footprint against its budgets here.
	plan, err := loader.NewPlan(m, loader.Options{
		ReaderArgs: loader.ReaderArgs{BatchSize: 4},
		Backend:    "file",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("slots:", plan.Slots)

	l, err := loader.Open(ctx, plan)
	if err != nil {
		log.Fatal(err)
	}
	var saved loader.State
	for {
		b, err := l.Next(ctx)
		if errors.Is(err, io.EOF) {
			break // the end of the epoch; the next call starts the next one
		}
		if err != nil {
			log.Fatal(err) // a sample that could not be read, named
		}
		for i := range b.Len() {
			fmt.Printf("sample %d: label %d, %d bytes\n", b.Indices[i], b.Labels[i], len(b.Sample(i)))
		}
		if b.Iteration == 0 {
			saved = l.State() // the position after this batch
		}
		b.Release() // its slot takes a later batch only after this; b is not read again
	}
	l.Close()

	// Resume: the same options with the saved state yield the rest.
	l, err = loader.New(ctx, m, loader.Options{
		ReaderArgs: loader.ReaderArgs{BatchSize: 4},
		Backend:    "file",
		State:      &saved,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	b, err := l.Next(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("resumed at batch", b.Iteration, "with", b.Len(), "samples")
	b.Release()

	// Output:
	// slots: 3
	// sample 0: label 0, 1 bytes
	// sample 1: label 0, 3 bytes
	// sample 2: label 0, 5 bytes
	// sample 3: label 1, 2 bytes
	// sample 4: label 1, 4 bytes
	// sample 5: label 1, 6 bytes
	// resumed at batch 1 with 2 samples
}
