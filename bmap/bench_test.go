// SPDX-License-Identifier: Apache-2.0

package bmap_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// BenchmarkBuild20k maps a 20 000-file dataset on an ext4 loop image with a
// warm inode cache and reports samples/s.
func BenchmarkBuild20k(b *testing.B) {
	fs := testfs.New(b, testfs.Options{Type: "ext4", SizeMB: 1024})
	data := make([]byte, 6000)
	for c := 0; c < 100; c++ {
		dir := fs.Path("train", fmt.Sprintf("n%08d", c))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < 200; i++ {
			if err := os.WriteFile(fmt.Sprintf("%s/img_%06d.JPEG", dir, i), data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	fs.Sync(b)
	root := fs.Path("train")
	if _, err := bmap.Build(context.Background(), root, bmap.BuildOptions{}); err != nil { // warm the inode cache
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{})
		if err != nil || len(m.Samples) != 20000 {
			b.Fatalf("%v, %d samples", err, len(m.Samples))
		}
	}
	b.ReportMetric(float64(20000*b.N)/b.Elapsed().Seconds(), "samples/s")
}

// imagenetMap is a synthetic map shaped like ImageNet's training set in
// fn.readers.file's folder layout: 1000 classes, n samples in all, each
// one extent, encoded in the native format.
func imagenetMap(tb testing.TB, n int) (*bmap.Map, []byte) {
	tb.Helper()
	m := &bmap.Map{Version: 1, Root: "/data/imagenet/train",
		Device: extentinfo.Device{Path: "/dev/vdb", Major: 253, Minor: 16, Disk: "vdb", LogicalBlockSize: 512, FSType: "ext4", FSUUID: "0f3c1a2e-5b7d-4e6f-9a8b-1c2d3e4f5a6b"}}
	const classes = 1000
	for c := range classes {
		m.Classes = append(m.Classes, fmt.Sprintf("n%08d", 1440764+c*37))
	}
	m.Samples = make([]bmap.Sample, n)
	for i := range m.Samples {
		c := i * classes / n
		size := int64(1000 + i*7919%200000)
		m.Samples[i] = bmap.Sample{Path: fmt.Sprintf("%s/%s_%d.JPEG", m.Classes[c], m.Classes[c], i), Label: int32(c), Size: size,
			Inode: uint64(12 + i), MtimeNs: 1764150000123456789 + int64(i), CtimeNs: 1764150000123456789 + int64(i),
			Extents: []extentinfo.Extent{{Logical: 0, Physical: uint64(1<<30 + i*4096*64), Length: uint64((size + 4095) &^ 4095)}}}
	}
	var buf bytes.Buffer
	if err := bmap.WriteBinary(&buf, m); err != nil {
		tb.Fatal(err)
	}
	return m, buf.Bytes()
}

// BenchmarkDecodeImageNet decodes a 1 281 167-sample map (what loaderd
// serve does per dataset before it is ready).
func BenchmarkDecodeImageNet(b *testing.B) {
	_, enc := imagenetMap(b, 1281167)
	b.SetBytes(int64(len(enc)))
	b.ResetTimer()
	for range b.N {
		if _, err := bmap.DecodeBinary(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFingerprintImageNet fingerprints a 1 281 167-sample map.
func BenchmarkFingerprintImageNet(b *testing.B) {
	m, _ := imagenetMap(b, 1281167)
	b.ResetTimer()
	for range b.N {
		_ = m.Fingerprint()
	}
}

// BenchmarkContentImageNet summarises a 1 281 167-sample map's content
// (what loaderd serve does per dataset when it loads the map).
func BenchmarkContentImageNet(b *testing.B) {
	m, _ := imagenetMap(b, 1281167)
	b.ResetTimer()
	var c bmap.Content
	for range b.N {
		c = m.Content()
	}
	b.StopTimer()
	js, err := json.Marshal(c)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(len(js)), "json_bytes")
}
