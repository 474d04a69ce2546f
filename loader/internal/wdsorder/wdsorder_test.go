// SPDX-License-Identifier: Apache-2.0

package wdsorder

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/nvfeed/nvfeed/loader/internal/daliorder"
)

// TestMatchesRealDALI replays testdata/dali.json, what DALI 2.4's
// fn.readers.webdataset returned over samples split across tars
// (testdata/gen_dali.py), case by case.
func TestMatchesRealDALI(t *testing.T) {
	b, err := os.ReadFile("testdata/dali.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		DALI   string `json:"dali"`
		Epochs int    `json:"epochs"`
		Cases  []struct {
			N             int     `json:"n"`
			Tars          int     `json:"tars"`
			BatchSize     int     `json:"batch_size"`
			InitialFill   int     `json:"initial_fill"`
			Seed          uint64  `json:"seed"`
			NumShards     int     `json:"num_shards"`
			ShardID       int     `json:"shard_id"`
			PadLastBatch  bool    `json:"pad_last_batch"`
			StickToShard  bool    `json:"stick_to_shard"`
			RandomShuffle bool    `json:"random_shuffle"`
			Samples       []int32 `json:"samples"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Cases) < 10 || ref.Epochs < 2 {
		t.Fatalf("testdata holds %d cases of %d epochs", len(ref.Cases), ref.Epochs)
	}
	for _, c := range ref.Cases {
		p := Params{N: c.N, BatchSize: c.BatchSize, InitialFill: c.InitialFill, Seed: c.Seed, NumShards: c.NumShards,
			ShardID: c.ShardID, PadLastBatch: c.PadLastBatch, StickToShard: c.StickToShard, RandomShuffle: c.RandomShuffle}
		t.Run(fmt.Sprintf("tars=%d/%+v", c.Tars, p), func(t *testing.T) {
			r := New(p)
			var got []int32
			for range ref.Epochs {
				got = append(got, r.Next(nil)...)
			}
			if len(c.Samples) < len(got) {
				t.Fatalf("DALI %s returned %d samples, %d epochs here are %d", ref.DALI, len(c.Samples), ref.Epochs, len(got))
			}
			if want := c.Samples[:len(got)]; !slices.Equal(got, want) {
				t.Fatalf("order differs from DALI %s's:\n got %v\nwant %v", ref.DALI, got, want)
			}
			// fn.readers.file's order (its list permuted) is not this one.
			if p.RandomShuffle && p.N > 20 {
				f := daliorder.New(p)
				var other []int32
				for range ref.Epochs {
					other = append(other, f.Next(nil)...)
				}
				if slices.Equal(other, got) {
					t.Errorf("fn.readers.file's order equals fn.readers.webdataset's")
				}
			}
		})
	}
}

// TestBytesIndependentOfN: a reader holds its buffer, not the list.
func TestBytesIndependentOfN(t *testing.T) {
	p := Params{N: 100_000_000, BatchSize: 64, NumShards: 1, RandomShuffle: true, InitialFill: 1024}
	if got := Bytes(p); got != 4*1024 {
		t.Fatalf("Bytes = %d, want %d", got, 4*1024)
	}
}
