// SPDX-License-Identifier: Apache-2.0

// Package benchrun drives a loader as fast as it goes and measures it: the
// engine of `loaderd bench`.
package benchrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// Options says how long to run and whether to verify.
type Options struct {
	Batches int  // stop after this many batches (0: use Epochs)
	Epochs  int  // stop after this many epochs (0 with Batches 0: one epoch)
	Verify  bool // compare every sample with a plain read of its file (the timing then includes it)
}

// Result is what a run measured. Its JSON form is what `loaderd bench
// --json` prints.
type Result struct {
	Backend     string         `json:"backend"`
	Memory      string         `json:"memory"`             // batch memory kind: pinned or gpu
	GPUPath     string         `json:"gpu_path,omitempty"` // for gpu memory: cufile (the backend writes the device) or bounce
	Samples     int64          `json:"samples"`
	Bytes       int64          `json:"bytes"` // file bytes delivered
	Seconds     float64        `json:"seconds"`
	SamplesPerS float64        `json:"samples_per_s"`
	BytesPerS   float64        `json:"bytes_per_s"`
	BatchMsP50  float64        `json:"batch_ms_p50"` // time to read one batch
	BatchMsP99  float64        `json:"batch_ms_p99"`
	CPUSeconds  float64        `json:"cpu_seconds"`        // user+sys of this process while reading (set-up excluded)
	Options     map[string]any `json:"backend_options"`    // the backend's options in effect
	Stats       backend.Stats  `json:"backend_stats"`      // its counters
	Verified    int64          `json:"verified,omitempty"` // samples compared with their files
	Failed      int64          `json:"failed_samples"`     // with --skip-errors: samples that could not be read (not in Samples)
}

// Run starts a loader on m with lo and consumes batches per o.
func Run(ctx context.Context, m *bmap.Map, lo loader.Options, o Options) (Result, error) {
	if o.Batches < 0 || o.Epochs < 0 {
		return Result{}, fmt.Errorf("%w: negative batches (%d) or epochs (%d)", loader.ErrOptions, o.Batches, o.Epochs)
	}
	if o.Batches == 0 && o.Epochs == 0 {
		o.Epochs = 1
	}
	if o.Verify && lo.Memory.OnGPU() {
		return Result{}, fmt.Errorf("%w: --verify compares host memory with the files: not with memory gpu (bench/gpu.sh checks GPU batches)", loader.ErrOptions)
	}
	l, err := loader.New(ctx, m, lo)
	if err != nil {
		return Result{}, err
	}
	defer l.Close()
	// A backend that registers batch slots with its rings on first use
	// (gds, bam) registers them all now. fio --fixedbufs registers its
	// buffers before its clock in the same way. So the figures are the
	// reads', not the one-off pinning a session's first batches pay.
	if p, ok := l.Backend().(interface{ PinBuffers() }); ok {
		p.PinBuffers()
	}
	// Like fio's job figures, time and CPU start once the loader is set
	// up (batch memory allocated and locked, device opened, slots
	// registered); its first reads are already under way, so the timed
	// part includes them.
	cpu0 := cpuSeconds()
	t0 := time.Now()
	res := Result{Backend: l.Backend().Name(), Memory: string(l.Memory().Desc().Kind)}
	res.GPUPath, _ = l.GPUPath()
	var lat []float64
	for epochs, batches := 0, 0; (o.Batches == 0 || batches < o.Batches) && (o.Epochs == 0 || epochs < o.Epochs); {
		b, err := l.Next(ctx)
		if errors.Is(err, io.EOF) {
			epochs++
			continue
		}
		if err != nil {
			return res, err
		}
		batches++
		lat = append(lat, float64(b.ReadTime().Microseconds())/1000)
		for i := 0; i < b.Len(); i++ {
			res.Bytes += b.Lengths[i]
		}
		res.Samples += int64(b.Len() - len(b.Failed))
		res.Failed += int64(len(b.Failed))
		if o.Verify {
			if err := verify(m, b); err != nil {
				b.Release()
				return res, err
			}
			res.Verified += int64(b.Len() - len(b.Failed))
		}
		b.Release()
	}
	res.Seconds = time.Since(t0).Seconds()
	res.Options, res.Stats = l.BackendOptions(), l.Backend().Stats()
	res.CPUSeconds = cpuSeconds() - cpu0
	res.SamplesPerS = float64(res.Samples) / res.Seconds
	res.BytesPerS = float64(res.Bytes) / res.Seconds
	slices.Sort(lat)
	res.BatchMsP50, res.BatchMsP99 = quantile(lat, 0.50), quantile(lat, 0.99)
	return res, nil
}

func verify(m *bmap.Map, b *loader.Batch) error {
	for i := 0; i < b.Len(); i++ {
		if slices.Contains(b.Failed, i) {
			continue
		}
		s := &m.Samples[b.Indices[i]]
		want, err := os.ReadFile(filepath.Join(m.Root, s.Path))
		if err != nil {
			return fmt.Errorf("verify: sample %d (%s): %w", b.Indices[i], s.Path, err)
		}
		if !bytes.Equal(b.Sample(i), want) {
			return fmt.Errorf("verify: sample %d (%s): delivered bytes differ from the file (epoch %d batch %d)", b.Indices[i], s.Path, b.Epoch, b.Iteration)
		}
	}
	return nil
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func cpuSeconds() float64 {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// Table renders results as an aligned text table.
func Table(w io.Writer, rs ...Result) {
	fmt.Fprintf(w, "%-8s %9s %10s %8s %10s %9s %8s %8s %7s\n", "backend", "samples", "MB", "seconds", "samples/s", "MB/s", "p50 ms", "p99 ms", "cpu s")
	for _, r := range rs {
		fmt.Fprintf(w, "%-8s %9d %10.1f %8.2f %10.0f %9.1f %8.2f %8.2f %7.2f\n", r.Backend, r.Samples, float64(r.Bytes)/1e6,
			r.Seconds, r.SamplesPerS, r.BytesPerS/1e6, r.BatchMsP50, r.BatchMsP99, r.CPUSeconds)
	}
}

// InfoLine prints the backend's options and counters on one line. The
// options come first, as given or defaulted, sorted by name. After "| ran:"
// come what actually ran (engine, device, freshness method) and the
// counters.
func InfoLine(w io.Writer, r Result) {
	keys := make([]string, 0, len(r.Options))
	for k := range r.Options {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Fprintf(w, "%s into %s memory:", r.Backend, r.Memory)
	if r.GPUPath != "" {
		fmt.Fprintf(w, " gpu_path=%s", r.GPUPath)
	}
	for _, k := range keys {
		fmt.Fprintf(w, " %s=%v", k, r.Options[k])
	}
	st := r.Stats
	fmt.Fprint(w, " | ran:")
	if st.Engine != "" {
		fmt.Fprintf(w, " engine=%s", st.Engine)
	}
	for _, l := range st.Labels {
		if l.Value != "" {
			fmt.Fprintf(w, " %s=%s", l.Name, l.Value)
		}
	}
	for _, c := range st.Counters {
		if c.Value != 0 {
			fmt.Fprintf(w, " %s=%d", c.Name, c.Value)
		}
	}
	if hits, misses := st.Counter("cache_hits"), st.Counter("cache_misses"); hits+misses > 0 {
		fmt.Fprintf(w, " cache_hit_rate=%.3f", float64(hits)/float64(hits+misses))
	}
	fmt.Fprintln(w)
}
