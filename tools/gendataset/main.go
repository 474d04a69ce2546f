// SPDX-License-Identifier: Apache-2.0

// Command gendataset writes an ImageNet-shaped synthetic dataset in DALI
// fn.readers.file layout: CLASSES subdirectories holding FILES files in all
// whose sizes follow a lognormal distribution around MEAN bytes.
//
//	gendataset --out DIR [--files 12000] [--classes 100] [--mean 110000] [--sigma 0.6] [--seed 1]
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
)

func main() {
	out := flag.String("out", "", "dataset root to create (required)")
	files := flag.Int("files", 12000, "number of files")
	classes := flag.Int("classes", 100, "number of class directories")
	mean := flag.Float64("mean", 110_000, "mean file size in bytes")
	sigma := flag.Float64("sigma", 0.6, "sigma of the lognormal size distribution")
	seed := flag.Uint64("seed", 1, "random seed (sizes and contents)")
	flag.Parse()
	if *out == "" || *files < 1 || *classes < 1 || *mean < 1 {
		fmt.Fprintln(os.Stderr, "usage: gendataset --out DIR [--files N] [--classes C] [--mean BYTES] [--sigma S] [--seed S]")
		os.Exit(2)
	}
	if err := generate(*out, *files, *classes, *mean, *sigma, *seed); err != nil {
		fmt.Fprintf(os.Stderr, "gendataset: %v\n", err)
		os.Exit(1)
	}
}

func generate(root string, files, classes int, mean, sigma float64, seed uint64) error {
	mu := math.Log(mean) - sigma*sigma/2
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		total int64
		mu2   sync.Mutex
	)
	for c := 0; c < classes; c++ {
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("n%08d", c)), 0o755); err != nil {
			return err
		}
	}
	workers := runtime.NumCPU() * 2
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var buf []byte
			var sum int64
			for i := w; i < files; i += workers {
				rng := rand.New(rand.NewPCG(seed, uint64(i)))
				size := int(math.Exp(mu + sigma*rng.NormFloat64()))
				size = max(size, 64)
				if cap(buf) < size {
					buf = make([]byte, size)
				}
				b := buf[:size]
				for j := 0; j+8 <= len(b); j += 8 {
					v := rng.Uint64()
					for k := 0; k < 8; k++ {
						b[j+k] = byte(v >> (8 * k))
					}
				}
				b[0], b[1], b[2] = 0xFF, 0xD8, 0xFF // a JPEG's first bytes, for file(1)
				c := i * classes / files
				p := filepath.Join(root, fmt.Sprintf("n%08d", c), fmt.Sprintf("n%08d_%07d.JPEG", c, i))
				if err := os.WriteFile(p, b, 0o644); err != nil {
					once.Do(func() { first = err })
					return
				}
				sum += int64(size)
			}
			mu2.Lock()
			total += sum
			mu2.Unlock()
		}(w)
	}
	wg.Wait()
	if first != nil {
		return first
	}
	fmt.Fprintf(os.Stderr, "gendataset: %d files in %d classes, %.1f MB under %s\n", files, classes, float64(total)/1e6, root)
	return nil
}
