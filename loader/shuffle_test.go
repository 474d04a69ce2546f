// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/loader/internal/daliorder"
)

// seqOf returns the next steps of l: each batch as "epoch iteration
// indices", an end of epoch as "EOF".
func seqOf(t *testing.T, l *Loader, steps int) []string {
	t.Helper()
	var out []string
	for i := 0; i < steps; i++ {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			out = append(out, "EOF")
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprint(b.Epoch, b.Iteration, b.Indices))
		b.Release()
	}
	return out
}

// TestDALIShuffleLoader: a loader with shuffle dali reads DALI's order
// (package daliorder's, checked against real DALI) batch by batch over
// several epochs, and a State taken anywhere resumes it exactly (the
// buffer's state rebuilt by replay).
func TestDALIShuffleLoader(t *testing.T) {
	m := makeDataset(t, 101, 5, 2000)
	for _, a := range []ReaderArgs{
		{BatchSize: 8, NumShards: 3, ShardID: 1, RandomShuffle: true, Seed: 3, Shuffle: ShuffleDALI, InitialFill: 20},
		{BatchSize: 8, NumShards: 3, ShardID: 2, RandomShuffle: true, Seed: 3, Shuffle: ShuffleDALI, PadLastBatch: true, StickToShard: true},
		{BatchSize: 5, NumShards: 2, RandomShuffle: true, Seed: 1 << 33, Shuffle: ShuffleDALI, InitialFill: 7, PadLastBatch: true},
	} {
		t.Run(fmt.Sprintf("%+v", a), func(t *testing.T) {
			o := Options{ReaderArgs: a, PrefetchQueueDepth: 2}
			ref, err := New(context.Background(), m, o)
			if err != nil {
				t.Fatal(err)
			}
			want := seqOf(t, ref, 30)
			ref.Close()
			// The batches are DALI's epochs cut into batch_size.
			d := daliorder.New(daliorder.Params{N: 101, BatchSize: a.BatchSize, ShardID: a.ShardID, NumShards: a.NumShards, RandomShuffle: true,
				InitialFill: cmp(a.InitialFill, DefaultInitialFill), Seed: a.Seed, PadLastBatch: a.PadLastBatch, StickToShard: a.StickToShard})
			var dali []string
			for e := 0; len(dali) < len(want); e++ {
				order := d.Next(nil)
				for i := 0; i*a.BatchSize < len(order); i++ {
					dali = append(dali, fmt.Sprint(e, i, order[i*a.BatchSize:min((i+1)*a.BatchSize, len(order))]))
				}
				dali = append(dali, "EOF")
			}
			if !slices.Equal(want, dali[:len(want)]) {
				t.Fatalf("the loader read\n %v\nDALI's order is\n %v", want, dali[:len(want)])
			}
			for _, cut := range []int{0, 3, 5, 13, 14, 22} {
				l, err := New(context.Background(), m, o)
				if err != nil {
					t.Fatal(err)
				}
				head := seqOf(t, l, cut)
				st := l.State()
				l.Close()
				o2 := o
				o2.State = &st
				r, err := New(context.Background(), m, o2)
				if err != nil {
					t.Fatal(err)
				}
				tail := seqOf(t, r, len(want)-cut)
				r.Close()
				if got := append(head, tail...); !slices.Equal(got, want) {
					t.Errorf("cut at %d (state %+v):\n got %v\nwant %v", cut, st, got, want)
				}
			}
		})
	}
}

// cmp returns a, or b when a is 0.
func cmp(a, b int) int {
	if a == 0 {
		return b
	}
	return a
}

// TestDALIShuffleNextAt: seeks backwards and forwards give the batches
// of the uninterrupted sequence; an epoch too far to replay is refused.
func TestDALIShuffleNextAt(t *testing.T) {
	m := makeDataset(t, 50, 3, 2000)
	o := Options{ReaderArgs: ReaderArgs{BatchSize: 8, RandomShuffle: true, Seed: 4, NumShards: 2, ShardID: 1, Shuffle: ShuffleDALI, InitialFill: 10}}
	ref, err := New(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	want := map[[2]int]string{}
	for e := 0; e < 4; e++ {
		eachBatch(ref, func(b *Batch) { want[[2]int{b.Epoch, b.Iteration}] = fmt.Sprint(b.Indices) })
	}
	ref.Close()
	l, err := New(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, at := range [][2]int{{0, 0}, {2, 1}, {1, 3}, {3, 0}, {0, 2}, {3, 2}, {1, 0}} {
		b, err := l.NextAt(context.Background(), at[0], at[1])
		if err != nil {
			t.Fatalf("NextAt%v: %v", at, err)
		}
		if got := fmt.Sprint(b.Indices); got != want[at] {
			t.Errorf("NextAt%v: %s, want %s", at, got, want[at])
		}
		b.Release()
	}
	far := MaxReplaySamples/25 + 1 // 25 samples an epoch
	if _, err := l.NextAt(context.Background(), far, 0); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "replays") {
		t.Errorf("NextAt(%d, 0): %v, want ErrOptions naming the replay", far, err)
	}
}

// TestStateVersion1Resumes: a version 1 state (no shuffle, no
// initial_fill) resumes where its sequence is unchanged.
func TestStateVersion1Resumes(t *testing.T) {
	m := makeDataset(t, 40, 2, 1000)
	o := Options{ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 2, RandomShuffle: true, Seed: 9}}
	// A run in the listed order: from a version 3 state at its start.
	v3 := State{Version: ListedVersion, Sampling: Sampling{N: 40, ReaderArgs: o.ReaderArgs.withDefaults()}}
	o.State = &v3
	l, err := New(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	want := seqOf(t, l, 12)
	l.Close()
	v1 := State{Version: 1, Sampling: Sampling{N: 40, ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 2, RandomShuffle: true, Seed: 9}}, Epoch: 1, Batch: 2}
	o.State = &v1
	r, err := New(context.Background(), m, o)
	if err != nil {
		t.Fatalf("version 1 state: %v", err)
	}
	defer r.Close()
	if got := seqOf(t, r, 4); !slices.Equal(got, want[8:12]) {
		t.Errorf("resumed from a version 1 state: %v, want %v", got, want[8:12])
	}
	if st := r.State(); st.Version != ListedVersion || st.Sampling.Shuffle != ShufflePermute || st.Sampling.InitialFill != DefaultInitialFill {
		t.Errorf("state after resuming: %+v, want version %d (the listed order's) with the defaults filled in", st, ListedVersion)
	}
}

// TestReplayStopsWithTheLoader: a loader replaying epochs to reach a
// resumed ShuffleDALI state (up to MaxReplaySamples samples: tens of
// seconds) stops replaying when it is closed or seeks elsewhere: Close
// and NextAt return at once, not when the replay would have ended.
func TestReplayStopsWithTheLoader(t *testing.T) {
	m := makeDataset(t, 100, 2, 100)
	for _, tc := range []struct {
		name string
		a    ReaderArgs
	}{
		{"2^30 samples", ReaderArgs{BatchSize: 8, NumShards: 1, RandomShuffle: true, Shuffle: ShuffleDALI}},
		{"2^30 epochs of one sample padded to 65536", ReaderArgs{BatchSize: 1 << 16, NumShards: 100, ShardID: 3, RandomShuffle: true, Shuffle: ShuffleDALI, PadLastBatch: true}},
	} {
		for _, how := range []string{"Close", "NextAt"} {
			t.Run(tc.name+"/"+how, func(t *testing.T) {
				smp := Sampling{N: 100, ReaderArgs: tc.a}
				far := MaxReplaySamples / ((smp.N + tc.a.NumShards - 1) / tc.a.NumShards)
				st := State{Version: StateVersion, Sampling: smp, Epoch: far}
				st.Sampling.ReaderArgs = st.Sampling.ReaderArgs.withDefaults()
				l, err := New(context.Background(), m, Options{ReaderArgs: tc.a, State: &st})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				time.Sleep(50 * time.Millisecond) // the replay is under way
				done := make(chan error, 1)
				t0 := time.Now()
				go func() {
					if how == "Close" {
						done <- l.Close()
						return
					}
					b, err := l.NextAt(context.Background(), 0, 0)
					if err == nil {
						b.Release()
					}
					done <- err
				}()
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
					if took := time.Since(t0); took > time.Second {
						t.Errorf("%s during a replay to epoch %d took %s", how, far, took)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("%s during a replay to epoch %d: still waiting after 5s (for the replay to end)", how, far)
				}
			})
		}
	}
}

// TestReplaysTakeTurns: loaders sharing a Replays of one turn replay one
// at a time; each closes at once, replaying or waiting for its turn, and
// every turn comes back.
func TestReplaysTakeTurns(t *testing.T) {
	m := makeDataset(t, 100, 2, 100)
	a := ReaderArgs{BatchSize: 8, NumShards: 1, RandomShuffle: true, Shuffle: ShuffleDALI}
	st := State{Version: StateVersion, Sampling: Sampling{N: 100, ReaderArgs: a.withDefaults()}, Epoch: MaxReplaySamples / 100}
	turns := NewReplays(1)
	var ls []*Loader
	for range 3 {
		l, err := New(context.Background(), m, Options{ReaderArgs: a, State: &st, Replays: turns})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls = append(ls, l)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after 5s: %s", what)
			}
		}
	}
	waitFor("a replay running", func() bool { return turns.Running() == 1 })
	time.Sleep(50 * time.Millisecond)
	if n := turns.Running(); n != 1 {
		t.Fatalf("%d replays running, want 1", n)
	}
	for _, l := range ls { // the one replaying and those waiting close at once
		t0 := time.Now()
		l.Close()
		if took := time.Since(t0); took > time.Second {
			t.Errorf("Close took %s", took)
		}
	}
	waitFor("every turn given back", func() bool { return turns.Running() == 0 })
}

// TestDALIFillTakesATurn: a ShuffleDALI producer starting afresh — at
// open, or after any seek, even within epoch 0 — fills its buffer
// (initial_fill samples, up to 2^24: a second of a core) in a turn of its
// Replays, so seeks back and forth within epoch 0 cannot busy more cores
// than replays can.
func TestDALIFillTakesATurn(t *testing.T) {
	m := makeDataset(t, 50, 2, 100)
	turns := NewReplays(1)
	if !turns.take(nil) { // held elsewhere
		t.Fatal("no turn")
	}
	l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 4, NumShards: 1, RandomShuffle: true, Shuffle: ShuffleDALI}, Replays: turns})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if b, err := l.Next(ctx); err == nil {
		b.Release()
		t.Fatalf("a batch of epoch 0 came while every turn was taken: its reader filled its buffer without one")
	}
	turns.give()
	b, err := l.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b.Release()
}
