// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestFiles: with Options.Files the loader reads those samples of the
// map, in the list's order as the sampling shards and shuffles it (the
// list's position i is the map's sample Files[i]), bytes checked; an
// index out of the map is refused.
func TestFiles(t *testing.T) {
	m := makeDataset(t, 40, 3, 2000)
	files := []int32{31, 4, 4, 17, 0, 39, 22, 8, 13}
	for _, args := range []ReaderArgs{
		{BatchSize: 4},
		{BatchSize: 2, NumShards: 2, ShardID: 1, PadLastBatch: true},
		{BatchSize: 3, ShuffleAfterEpoch: true},
		{BatchSize: 3, RandomShuffle: true, Shuffle: ShuffleDALI, Seed: 4},
	} {
		l, err := New(context.Background(), m, Options{ReaderArgs: args, Files: files})
		if err != nil {
			t.Fatal(err)
		}
		smp := Sampling{N: len(files), ReaderArgs: Options{ReaderArgs: args}.WithDefaults().ReaderArgs}
		for e := range 2 {
			got := collectEpoch(t, l, m, true)
			order, _ := smp.EpochOrder(e, nil, nil)
			var want []int32
			for _, i := range order {
				want = append(want, files[i])
			}
			if !slices.Equal(got, want) {
				t.Errorf("%+v epoch %d: read %v, want %v", args, e, got, want)
			}
		}
		l.Close()
	}
	if _, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 1}, Files: []int32{3, 40}}); !errors.Is(err, ErrOptions) {
		t.Errorf("files past the map: %v, want ErrOptions", err)
	}
}
