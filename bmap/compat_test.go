// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/nvfeed/nvfeed/extentinfo"
)

// v1Map is the map held by testdata/v1: written by the version 1 encoder
// (before tensors and file lists), it must decode to this forever.
func v1Map() *Map {
	return &Map{Version: 1, Root: "/data/train",
		Device: extentinfo.Device{Path: "/dev/nvme0n1p2", Major: 259, Minor: 2, Disk: "/dev/nvme0n1",
			PartitionStart: 1 << 20, LogicalBlockSize: 512, FSType: "ext4", FSUUID: "0b5e1a9e-7d6c-4c1e-9a55-3f0e2d6b8a11"},
		Classes: []string{"cat", "dog", "empty", "fish"},
		Samples: []Sample{
			{Path: "cat/1.jpg", Label: 0, Size: 5000, Inode: 12, MtimeNs: 1_700_000_000_123_456_789, CtimeNs: 1_700_000_001_000_000_000,
				Extents: []extentinfo.Extent{{Logical: 0, Physical: 1 << 30, Length: 8192, Flags: extentinfo.FlagLast}}},
			{Path: "cat/2.jpg", Label: 0, Size: 10000, Inode: 13, MtimeNs: -5, CtimeNs: 7,
				Extents: []extentinfo.Extent{{Logical: 0, Physical: 4096, Length: 4096}, {Logical: 4096, Physical: 81920, Length: 8192, Flags: extentinfo.FlagUnwritten | extentinfo.FlagLast}}},
			{Path: "dog/a.png", Label: 1, Size: 60, Inode: 14, Reason: Inline,
				Extents: []extentinfo.Extent{{Logical: 0, Physical: 0, Length: 4096, Flags: extentinfo.FlagDataInline | extentinfo.FlagNotAligned | extentinfo.FlagLast}}},
			{Path: "fish/x.jpg", Label: 3, Size: 0, Inode: 15},
			{Path: "fish/y.jpg", Label: 3, Size: 777, Inode: 16, Reason: OtherFS},
		}}
}

// TestV1MapsDecode decodes the maps the version 1 encoder wrote (binary
// and JSON, committed in testdata/v1): they must stay readable.
func TestV1MapsDecode(t *testing.T) {
	for _, name := range []string{"train.bmap", "train.json"} {
		t.Run(name, func(t *testing.T) {
			got, err := Load(filepath.Join("testdata/v1", name))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, v1Map()) {
				t.Errorf("decoded\n %+v\nwant\n %+v", got, v1Map())
			}
		})
	}
}
