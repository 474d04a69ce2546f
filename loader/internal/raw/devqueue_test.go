// SPDX-License-Identifier: Apache-2.0

package raw

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/uring"
)

func TestDeviceQueueLimit(t *testing.T) {
	for _, c := range []struct {
		name              string
		tags, engines, qd int
		want              int
	}{
		{"unknown tags: the engine's depth", 0, 8, 32, 32},
		{"one engine: its depth", 128, 1, 32, 32},
		{"8 engines on 128 tags", 128, 8, 32, 16},
		{"3 engines: rounded down", 128, 3, 64, 42},
		{"more engines than tags: one each", 4, 9, 32, 1},
		{"no engine counted yet", 128, 0, 32, 32},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := &deviceQueue{tags: c.tags}
			q.engines.Store(int32(c.engines))
			if got := q.limit(c.qd); got != c.want {
				t.Errorf("limit(%d) with %d tags, %d engines = %d, want %d", c.qd, c.tags, c.engines, got, c.want)
			}
		})
	}
	var none *deviceQueue
	if got := none.limit(7); got != 7 {
		t.Errorf("no queue: limit(7) = %d, want 7", got)
	}
}

// TestDeviceTags reads a device's tags from a sysfs laid out as the
// kernel's: a disk's hardware queues summed, a partition's from its disk,
// 0 where nothing says.
func TestDeviceTags(t *testing.T) {
	sys := t.TempDir()
	write := func(rel, text string) {
		p := filepath.Join(sys, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(dev, target string) {
		if err := os.MkdirAll(filepath.Join(sys, "dev", "block"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(sys, target), filepath.Join(sys, "dev", "block", dev)); err != nil {
			t.Fatal(err)
		}
	}
	write("devices/virtual/block/loop0/mq/0/nr_tags", "128\n")
	link("7:0", "devices/virtual/block/loop0")
	write("devices/pci/nvme0n1/mq/0/nr_tags", "1023\n")
	write("devices/pci/nvme0n1/mq/1/nr_tags", "1023\n")
	write("devices/pci/nvme0n1/nvme0n1p1/partition", "1\n")
	link("259:1", "devices/pci/nvme0n1/nvme0n1p1")
	write("devices/virtual/block/dm-0/queue/nr_requests", "128\n") // bio-based: no mq
	link("253:0", "devices/virtual/block/dm-0")
	write("devices/virtual/block/loop1/mq/0/nr_tags", "many\n")
	link("7:1", "devices/virtual/block/loop1")
	for _, c := range []struct {
		name         string
		major, minor uint32
		want         int
	}{
		{"loop: one queue", 7, 0, 128},
		{"a partition: its disk's queues summed", 259, 1, 2046},
		{"no blk-mq queues", 253, 0, 0},
		{"unreadable tags", 7, 1, 0},
		{"no such device", 8, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := deviceTags(sys, unix.Mkdev(c.major, c.minor)); got != c.want {
				t.Errorf("deviceTags(%d:%d) = %d, want %d", c.major, c.minor, got, c.want)
			}
		})
	}
}

// TestUringEngineKeepsToItsShare: an engine whose device queue allows it
// two requests never has more in flight, and reads every byte.
func TestUringEngineKeepsToItsShare(t *testing.T) {
	f := newEngineFixture(t)
	q := &deviceQueue{tags: 8}
	q.engines.Store(4)
	e, err := newUringEngine(f.fd, 8, ringSetup{queue: q}, nil)
	if errors.Is(err, uring.ErrUnsupported) {
		t.Skipf("io_uring refused here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	for _, op := range f.run(t, e, len(f.data), 4096, false, func(int) string { return "s" }) {
		if op.err != nil {
			t.Fatalf("op at %d: %v", op.off, op.err)
		}
	}
	if !bytes.Equal(f.mem[:len(f.data)], f.data) {
		t.Error("bytes read differ from the file's")
	}
	if p := e.peakInflight(); p != 2 {
		t.Errorf("peak in flight %d, want the engine's share, 2 (8 tags, 4 engines)", p)
	}
}
