// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestBounds(t *testing.T) {
	smp := Sampling{N: 97, ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 3}}
	state := func(epoch, batch int) *State {
		return &State{Version: StateVersion, Sampling: smp, Epoch: epoch, Batch: batch}
	}
	dali := func(epoch int) *State { // 33 samples an epoch
		return &State{Version: StateVersion, Sampling: Sampling{N: 97, ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 3,
			RandomShuffle: true, Shuffle: ShuffleDALI, InitialFill: 8}}, Epoch: epoch}
	}
	tests := []struct {
		name string
		err  error
		want string // "" for valid
	}{
		{"args ok", ReaderArgs{BatchSize: 1}.Validate(), ""},
		{"args num_shards -1", ReaderArgs{BatchSize: 1, NumShards: -1}.Validate(), "num_shards -1 not in [1, 2147483647]"},
		{"args num_shards 2^63-1", ReaderArgs{BatchSize: 1, NumShards: math.MaxInt64}.Validate(), "num_shards 9223372036854775807"},
		{"args shard_id 2^63-1", ReaderArgs{BatchSize: 1, ShardID: math.MaxInt64, NumShards: 2}.Validate(), "shard_id 9223372036854775807 not in [0, num_shards=2)"},
		{"args shard_id with num_shards 0", ReaderArgs{BatchSize: 1, ShardID: 1}.Validate(), "shard_id 1 not in [0, num_shards=1)"},
		{"args batch_size -2^63", ReaderArgs{BatchSize: math.MinInt64}.Validate(), "batch_size -9223372036854775808 not in [1, 65536]"},
		{"sampling N 2^31", Sampling{N: 1 << 31, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 1}}.Validate(), "2147483648 samples"},
		{"sampling num_shards over N", Sampling{N: 2, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 3}}.Validate(), "num_shards 3 not in [1, 2]"},
		{"position ok", CheckPosition(MaxEpoch, MaxIteration), ""},
		{"position epoch 2^63-1", CheckPosition(math.MaxInt64, 0), "epoch 9223372036854775807 not in [0, 2147483647]"},
		{"position epoch 2^31", CheckPosition(1<<31, 0), "epoch 2147483648"},
		{"position iteration -1", CheckPosition(0, -1), "iteration -1 not in [0, 2147483647]"},
		{"state ok", state(5, 8).Validate(), ""},
		{"state max epoch", state(MaxEpoch, 8).Validate(), ""},
		{"state version", (&State{Version: 7, Sampling: smp}).Validate(), "version 7"},
		{"state epoch 2^63-1", state(math.MaxInt64, 0).Validate(), "epoch 9223372036854775807 not in [0, 2147483647]"},
		{"state epoch -2^63", state(math.MinInt64, 0).Validate(), "epoch -9223372036854775808"},
		{"state batch past the end", state(0, 9).Validate(), "batch 9 not in [0, 8]"},
		{"state batch -1", state(0, -1).Validate(), "batch -1"},
		{"state sampling", (&State{Version: StateVersion, Sampling: Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 0}}}).Validate(), "num_shards 0"},
		{"state shuffle", (&State{Version: StateVersion, Sampling: Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 1, Shuffle: "full"}}}).Validate(), `shuffle "full" (want "permute" or "dali"`},
		{"state dali at the replay limit", dali(MaxReplaySamples / 33).Validate(), ""},
		{"state dali past the replay limit", dali(MaxReplaySamples/33 + 1).Validate(), "epoch 32537632 with shuffle \"dali\": reaching it replays the 32537632 epochs before it, 33 samples each, over the limit of 1073741824 samples (epoch 32537631 at most)"},
		{"state dali unshuffled replays nothing", func() error { st := dali(MaxEpoch); st.Sampling.RandomShuffle = false; return st.Validate() }(), ""},
		{"state permute replays nothing", func() error { st := dali(MaxEpoch); st.Sampling.Shuffle = ShufflePermute; return st.Validate() }(), ""},
		{"args shuffle_after_epoch", ReaderArgs{BatchSize: 1, ShuffleAfterEpoch: true}.Validate(), ""},
		{"args shuffle_after_epoch with random_shuffle", ReaderArgs{BatchSize: 1, ShuffleAfterEpoch: true, RandomShuffle: true}.Validate(), "shuffle_after_epoch and random_shuffle cannot both be true"},
		{"args shuffle_after_epoch with stick_to_shard", ReaderArgs{BatchSize: 1, ShuffleAfterEpoch: true, StickToShard: true}.Validate(), "shuffle_after_epoch and stick_to_shard cannot both be true"},
		{"state shuffle_after_epoch past the replay limit", (&State{Version: StateVersion, Sampling: Sampling{N: 97, ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 3, ShuffleAfterEpoch: true}}, Epoch: MaxReplaySamples/97 + 1}).Validate(), "with shuffle_after_epoch: reaching it replays"},
		{"state version 1", (&State{Version: 1, Sampling: smp, Epoch: 2}).Validate(), ""},
		{"state version 1 with stick_to_shard", (&State{Version: 1, Sampling: Sampling{N: 97, ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 3, StickToShard: true, RandomShuffle: true}}}).Validate(), "version 1, whose random_shuffle with stick_to_shard read other samples"},
		{"state version 1 with a version 2 field", (&State{Version: 1, Sampling: Sampling{N: 97, ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 3, Shuffle: ShuffleDALI}}}).Validate(), "version 1, this loader reads version 4 (and 3, 2, 1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			switch {
			case tt.want == "" && tt.err != nil:
				t.Errorf("err = %v, want nil", tt.err)
			case tt.want != "" && (!errors.Is(tt.err, ErrOptions) || !strings.Contains(tt.err.Error(), tt.want)):
				t.Errorf("err = %v, want ErrOptions naming %q", tt.err, tt.want)
			}
		})
	}
}

// FuzzState: decoding a state from msgpack (the wire form) either fails,
// or gives a state that Validate refuses with ErrOptions, or one whose
// arithmetic holds: its epoch's order and the next epoch's are in range.
func FuzzState(f *testing.F) {
	for _, st := range []State{
		{Version: StateVersion, Sampling: Sampling{N: 97, ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 3, ShardID: 2, RandomShuffle: true, Seed: 7}}, Epoch: 3, Batch: 2},
		{Version: StateVersion, Sampling: Sampling{N: 10, ReaderArgs: ReaderArgs{BatchSize: 3, NumShards: 3, PadLastBatch: true}}, Epoch: MaxEpoch, Batch: 2},
		{Version: StateVersion, Sampling: Sampling{N: 10, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 3}}, Epoch: math.MaxInt64, Batch: 0},
		{Version: StateVersion, Sampling: Sampling{N: 50, ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 2, RandomShuffle: true, Shuffle: ShuffleDALI, InitialFill: 9, StickToShard: true}}, Epoch: 4, Batch: 1},
	} {
		b, err := msgpack.Marshal(st)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var st State
		dec := msgpack.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields(true)
		if len(b) > 256 || dec.Decode(&st) != nil {
			return // long inputs could carry huge array headers: the daemon checks those before decoding
		}
		if err := st.Validate(); err != nil {
			if !errors.Is(err, ErrOptions) {
				t.Fatalf("%+v: error %v does not wrap ErrOptions", st, err)
			}
			return
		}
		s := st.Sampling
		if s.N > 1<<16 || (s.daliShuffled() && (int64(st.Epoch+1)*int64(s.N) > 1<<20 || s.InitialFill > 1<<16)) {
			return // valid, but an order of that many samples (or replayed ones) is too slow to fuzz
		}
		for _, e := range []int{st.Epoch, st.Epoch + 1} {
			order, _ := s.EpochOrder(e, nil, nil)
			if len(order) != s.EpochSamples(e) || s.EpochBatches(e) < 0 {
				t.Fatalf("%+v: epoch %d: %d samples in the order, EpochSamples %d", st, e, len(order), s.EpochSamples(e))
			}
			for _, i := range order {
				if i < 0 || int(i) >= s.N {
					t.Fatalf("%+v: epoch %d: sample %d out of [0, %d)", st, e, i, s.N)
				}
			}
		}
	})
}

// TestProducerPanicFailsTheLoader: a producer that panics (here made to
// by an epoch past the bounds, which validation no longer lets through)
// fails its loader, whose Next names the cause, and the process goes on.
func TestProducerPanicFailsTheLoader(t *testing.T) {
	m := makeDataset(t, 30, 3, 500)
	l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 3}, Backend: "file"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.stop()
	l.start(math.MinInt64, 0) // as the epoch after 2^63-1 once did: the shard (and its range) is negative
	for i := 0; i < 2; i++ {
		_, err := l.Next(context.Background())
		if !errors.Is(err, ErrInternal) || !strings.Contains(err.Error(), "panicked") || !strings.Contains(err.Error(), "index out of range") {
			t.Fatalf("Next %d after the producer panicked: %v, want ErrInternal naming the panic", i, err)
		}
	}
	if _, err := l.NextAt(context.Background(), 0, 0); !errors.Is(err, ErrInternal) {
		t.Errorf("NextAt after the producer panicked: %v, want ErrInternal", err)
	}
}

// TestNextAtRefusesHugeEpochs: an epoch past MaxEpoch is refused, not
// wrapped into a negative shard.
func TestNextAtRefusesHugeEpochs(t *testing.T) {
	m := makeDataset(t, 30, 3, 500)
	l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 3}, Backend: "file"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, at := range [][2]int{{math.MaxInt64, 0}, {math.MaxInt64, 1 << 20}, {MaxEpoch + 1, 0}, {-1, 0}, {0, math.MaxInt64}} {
		if _, err := l.NextAt(context.Background(), at[0], at[1]); !errors.Is(err, ErrOptions) {
			t.Errorf("NextAt%v: %v, want ErrOptions", at, err)
		}
	}
	b, err := l.NextAt(context.Background(), MaxEpoch, 0)
	if err != nil || b.Epoch != MaxEpoch {
		t.Fatalf("NextAt(MaxEpoch, 0): %v %v", b, err)
	}
	b.Release()
}

// TestCheckOnce checks that Options.Check's result is taken as it is,
// and checked again once a field Validate reads has changed.
func TestCheckOnce(t *testing.T) {
	o, err := Options{ReaderArgs: ReaderArgs{BatchSize: 4}}.Check()
	if err != nil {
		t.Fatal(err)
	}
	if again, err := o.Check(); err != nil || again.checked != o.checked {
		t.Fatalf("Check of checked options: %v, checked anew: %v", err, again.checked != o.checked)
	}
	o.Slots = o.PrefetchQueueDepth
	if _, err := o.Check(); !errors.Is(err, ErrOptions) {
		t.Fatalf("Check after slots changed to the prefetch depth: %v, want ErrOptions", err)
	}
}
