// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
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
	if st := r.State(); st.Version != 2 || st.Sampling.Shuffle != ShufflePermute || st.Sampling.InitialFill != DefaultInitialFill {
		t.Errorf("state after resuming: %+v, want version 2 (the listed order's, no stages) with the defaults filled in", st)
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

// mixing returns what is wrong with the mix of orders (seed, epoch) of
// n samples in batches of b, over seeds 1 to 4 and epochs 0 to 4, as a
// uniform permutation's statistics would have it (6 standard deviations):
// each epoch's displacements (v-p mod n, in 20 bins: chi-square), its
// near neighbours (values within 8 at adjacent positions), and the pairs
// of a batch in one epoch that meet in a batch again in the next.
func mixing(order func(seed uint64, epoch int) []int32, n, b int) (bad []string, summary string) {
	sigmas := func(got, want, sd float64) bool { return math.Abs(got-want) > 6*sd }
	var near, again, wantAgain float64
	pairs := 0.0 // pairs in one batch of an epoch
	for q := 0; q < n; q += b {
		c := float64(min(b, n-q))
		pairs += c * (c - 1) / 2
	}
	for seed := uint64(1); seed <= 4; seed++ {
		var prev []int32
		for e := range 5 {
			o := order(seed, e)
			bins := make([]float64, 20)
			for p, v := range o {
				bins[(int(v)-p+n)%n*20/n]++
				if p > 0 && abs(int(v)-int(o[p-1])) <= 8 {
					near++
				}
			}
			chi := 0.0
			for _, c := range bins {
				chi += (c - float64(n)/20) * (c - float64(n)/20) / (float64(n) / 20)
			}
			if sigmas(chi, 19, math.Sqrt(2*19)) {
				bad = append(bad, fmt.Sprintf("seed %d epoch %d: displacements' chi-square %.0f over 19 dof", seed, e, chi))
			}
			if prev != nil {
				again += float64(meetAgain(prev, o, n, b))
				wantAgain += pairs * pairs / (float64(n) * float64(n-1) / 2)
			}
			prev = o
		}
	}
	wantNear := 20 * 2 * float64(8*n-36) / float64(n) // 20 orders of n-1 adjacent pairs, each near w.p. 2(8n-36)/(n(n-1))
	if sigmas(near, wantNear, math.Sqrt(wantNear)) {
		bad = append(bad, fmt.Sprintf("%.0f near neighbours adjacent, a uniform permutation %.0f", near, wantNear))
	}
	if sigmas(again, wantAgain, math.Sqrt(wantAgain)) {
		bad = append(bad, fmt.Sprintf("%.0f pairs of a batch meet in a batch the next epoch, a uniform permutation %.0f", again, wantAgain))
	}
	return bad, fmt.Sprintf("near neighbours %.0f (uniform %.0f), pairs meeting again %.0f (uniform %.0f)", near, wantNear, again, wantAgain)
}

func abs(x int) int { return max(x, -x) }

// meetAgain counts the pairs of samples in one batch of order a that are
// in one batch of order b.
func meetAgain(a, b []int32, n, bs int) int {
	batchOf := make([]int, n)
	for p, v := range b {
		batchOf[v] = p / bs
	}
	count := 0
	for q := 0; q < n; q += bs {
		seen := map[int]int{}
		for _, v := range a[q:min(q+bs, n)] {
			count += seen[batchOf[v]]
			seen[batchOf[v]]++
		}
	}
	return count
}

// TestShuffleMixes: a file dataset's permutation, computed (version 4)
// or listed (version 3), mixes as a uniform one across positions, epochs
// and seeds; poor permutations fail the same statistics (an affine map,
// a shuffle within windows, the same order every epoch).
func TestShuffleMixes(t *testing.T) {
	const n, b = 10_000, 64
	sampling := func(listed bool) func(uint64, int) []int32 {
		return func(seed uint64, e int) []int32 {
			s := Sampling{N: n, ReaderArgs: ReaderArgs{BatchSize: b, NumShards: 1, RandomShuffle: true, Seed: seed}.withDefaults(), listed: listed}
			o, _ := s.EpochOrder(e, nil, nil)
			return o
		}
	}
	affine := func(seed uint64, e int) []int32 {
		a := 7919 + 2*int(seed)*11 + 10*e // odd, not a multiple of 5: coprime with n
		o := make([]int32, n)
		for p := range o {
			o[p] = int32((a*p + int(seed)) % n)
		}
		return o
	}
	windows := func(seed uint64, e int) []int32 {
		o := make([]int32, 0, n)
		for w := 0; w < n; w += 100 {
			for _, v := range Permutation(seed, e*1000+w, 100, nil) {
				o = append(o, int32(w)+v)
			}
		}
		return o
	}
	fixed := func(seed uint64, _ int) []int32 { return sampling(false)(seed, 0) }
	for _, tt := range []struct {
		name string
		perm func(uint64, int) []int32
		good bool
	}{
		{"computed", sampling(false), true},
		{"listed", sampling(true), true},
		{"affine", affine, false},
		{"windows of 100", windows, false},
		{"same every epoch", fixed, false},
	} {
		bad, summary := mixing(tt.perm, n, b)
		if tt.good && len(bad) > 0 {
			t.Errorf("%s: mixes worse than a uniform permutation: %s", tt.name, strings.Join(bad, "; "))
		}
		if !tt.good && len(bad) == 0 {
			t.Errorf("%s: a poor permutation passes the statistics", tt.name)
		}
		t.Logf("%s: %s; %d failed", tt.name, summary, len(bad))
	}
}

// TestStateVersionSelectsOrder: a file dataset's permute order is the
// computed one at a fresh open (its states version 4) and the listed one
// from a state of version 3 or 2 (its states version 2, so a run keeps
// it);
// each resumes mid-epoch exactly, and the daemon's admission counts a
// computed order as one batch's indices.
func TestStateVersionSelectsOrder(t *testing.T) {
	m := makeDataset(t, 101, 5, 1000)
	args := ReaderArgs{BatchSize: 5, NumShards: 2, ShardID: 1, RandomShuffle: true, Seed: 3}
	smp := Sampling{N: 101, ReaderArgs: args.withDefaults()}
	open := func(st *State) *Loader {
		t.Helper()
		l, err := New(context.Background(), m, Options{ReaderArgs: args, PrefetchQueueDepth: 2, State: st})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, tt := range []struct {
		name    string
		state   *State
		version int
		listed  bool
	}{
		{"fresh", nil, StateVersion, false},
		{"version 3", &State{Version: ListedVersion, Sampling: smp}, 2, true},
		{"version 2", &State{Version: 2, Sampling: smp}, 2, true},
		{"version 4", &State{Version: StateVersion, Sampling: smp}, StateVersion, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPlan(m, Options{ReaderArgs: args, State: tt.state})
			if err != nil {
				t.Fatal(err)
			}
			if computed := p.SamplerBytes == 4*int64(args.BatchSize); computed == tt.listed {
				t.Errorf("SamplerBytes %d, want a listed order's: %v", p.SamplerBytes, tt.listed)
			}
			ref := smp
			ref.listed = tt.listed
			var want []string
			o := ref.Orders()
			for e := range 3 {
				order := o.Epoch(e, nil)
				for b := 0; b*args.BatchSize < len(order); b++ {
					want = append(want, fmt.Sprint(e, b, order[b*args.BatchSize:min((b+1)*args.BatchSize, len(order))]))
				}
				want = append(want, "EOF")
			}
			l := open(tt.state)
			got := seqOf(t, l, 14)
			mid := l.State()
			l.Close()
			if !slices.Equal(got, want[:14]) {
				t.Fatalf("read %v, want %v", got, want[:14])
			}
			if mid.Version != tt.version {
				t.Errorf("state version %d, want %d", mid.Version, tt.version)
			}
			r := open(&mid)
			defer r.Close()
			if got := seqOf(t, r, 10); !slices.Equal(got, want[14:24]) {
				t.Errorf("resumed at %d/%d: %v, want %v", mid.Epoch, mid.Batch, got, want[14:24])
			}
		})
	}
	fresh, _ := smp.EpochOrder(0, nil, nil)
	smp.listed = true
	if listed, _ := smp.EpochOrder(0, nil, nil); slices.Equal(fresh, listed) {
		t.Error("the computed and the listed orders are the same")
	}
}
