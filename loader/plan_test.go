// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// TestPlan is options in, plan out (testdata/plan): "map" makes the map
// planned over (samples=N and size=S, or sizes=(a,b,...); numpy with
// offset=O and shape=(d1,d2) for a tensor map of float32); "plan" reads
// the request's fields one key=value a line (batch_size, num_shards,
// shard_id, prefetch_queue_depth, release_after, memory, gpu_path,
// backend, device_id, slots) and prints the plan: slots and slot size,
// footprint (host and device bytes), the GPU paths tried, the dense row,
// or the refusal.
func TestPlan(t *testing.T) {
	datadriven.Walk(t, "testdata/plan", func(t *testing.T, path string) {
		var m *bmap.Map
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "map":
				m = planMap(t, d)
				return ""
			case "plan":
				r, slots := planRequest(t, d.Input)
				o, err := r.Options()
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				if slots != 0 {
					o.Slots = slots
				}
				p, err := NewPlan(m, o)
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				return describePlan(p)
			}
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		})
	})
}

// planMap makes the map a "map" command describes.
func planMap(t *testing.T, d *datadriven.TestData) *bmap.Map {
	m := &bmap.Map{Root: "/data"}
	var sizes []int64
	var offset int64
	var shape []int64
	for _, a := range d.CmdArgs {
		switch a.Key {
		case "samples":
			n, _ := strconv.Atoi(a.Vals[0])
			sizes = make([]int64, n)
		case "size":
			s, _ := strconv.ParseInt(a.Vals[0], 10, 64)
			for i := range sizes {
				sizes[i] = s
			}
		case "sizes":
			for _, v := range a.Vals {
				s, _ := strconv.ParseInt(v, 10, 64)
				sizes = append(sizes, s)
			}
		case "numpy":
			m.Reader = bmap.ReaderNumpy
		case "offset":
			offset, _ = strconv.ParseInt(a.Vals[0], 10, 64)
		case "shape":
			for _, v := range a.Vals {
				s, _ := strconv.ParseInt(v, 10, 64)
				shape = append(shape, s)
			}
		default:
			t.Fatalf("map: unknown argument %q", a.Key)
		}
	}
	for i, s := range sizes {
		smp := bmap.Sample{Path: fmt.Sprintf("s%d", i), Size: s}
		if m.Reader == bmap.ReaderNumpy {
			smp.Offset = offset
			smp.Tensor = &bmap.Tensor{DType: npy.Float32, Shape: shape}
		}
		m.Samples = append(m.Samples, smp)
	}
	return m
}

// planRequest reads a "plan" command's request, and the slots asked
// for beyond it (Options.Slots, 0: none).
func planRequest(t *testing.T, in string) (Request, int) {
	var r Request
	slots := 0
	num := func(v string) int {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, line := range strings.Split(strings.TrimSpace(in), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		switch k {
		case "batch_size":
			r.BatchSize = num(v)
		case "num_shards":
			r.NumShards = num(v)
		case "shard_id":
			r.ShardID = num(v)
		case "prefetch_queue_depth":
			r.PrefetchQueueDepth = new(num(v))
		case "release_after":
			r.ReleaseAfter = new(num(v))
		case "memory":
			r.Memory = batchmem.Kind(v)
		case "gpu_path":
			r.GPUPath = v
		case "backend":
			r.Backend = v
		case "device_id":
			r.Device = num(v)
		case "slots":
			slots = num(v)
		default:
			t.Fatalf("plan: unknown field %q", k)
		}
	}
	return r, slots
}

// describePlan prints what a plan says.
func describePlan(p Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "prefetch=%d release_after=%d slots=%d slot_size=%d\n", p.PrefetchQueueDepth, p.ReleaseAfter, p.Slots, p.Footprint.SlotSize)
	fmt.Fprintf(&b, "footprint: host=%d device=%d\n", p.Footprint.Host, p.Footprint.Device)
	paths, whys := p.GPUPaths()
	for i, path := range paths {
		if path != "" {
			fmt.Fprintf(&b, "gpu_path %s (%s): backend %s\n", path, whys[i], p.ways[i].spec.Name)
		} else {
			fmt.Fprintf(&b, "host: backend %s\n", p.ways[i].spec.Name)
		}
	}
	if p.DenseRow > 0 {
		fmt.Fprintf(&b, "dense: rows of %d bytes\n", p.DenseRow)
	} else {
		b.WriteString("ragged\n")
	}
	return b.String()
}

// TestPlanFootprintIsMemory: the memory a plan's loader opens is the
// plan's footprint, as batch memory describes it: host memory's size, or
// GPU memory's device size with a staging area where the plan counts
// one (batchmem's own test checks the staging area's size).
func TestPlanFootprintIsMemory(t *testing.T) {
	m := makeDataset(t, 24, 3, 3000)
	p, err := NewPlan(m, Options{ReaderArgs: ReaderArgs{BatchSize: 4}, PrefetchQueueDepth: 3, ReleaseAfter: 2})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := l.Memory().Desc()
	if d.Size != p.Footprint.Host || p.Footprint.Device != 0 || d.Slots != p.Slots || d.SlotSize != p.Footprint.SlotSize || p.Slots != 3+2+1 {
		t.Errorf("plan %+v (%d slots), memory %+v", p.Footprint, p.Slots, d)
	}
}

// TestStandinPlanFootprintIsMemory: on the CUDA stand-in, GPU memory by
// bounce (staging) and by cufile (none) is the plan's footprint.
func TestStandinPlanFootprintIsMemory(t *testing.T) {
	if !standin.InChild(t) {
		return
	}
	m := makeDataset(t, 24, 3, 3000)
	standin.ProvideCuFileHost(t, false, m.Root)
	for _, path := range []string{GPUPathBounce, GPUPathCuFile} {
		p, err := NewPlan(m, Options{ReaderArgs: ReaderArgs{BatchSize: 4}, Memory: batchmem.GPU, GPUPath: path})
		if err != nil {
			t.Fatal(err)
		}
		l, err := Open(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		d, staging := l.Memory().Desc(), l.Memory().Slot(0).Host != nil
		if d.Size != p.Footprint.Device || staging != (p.Footprint.Host == d.Size) || staging != (path == GPUPathBounce) {
			t.Errorf("gpu_path %s: plan %+v, memory %+v with staging %v", path, p.Footprint, d, staging)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
