// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
)

// TestJobsJoin: the registry itself, step by step. Each case starts from
// an empty registry; a step joins (or, with leave, takes off) a session
// of an owner's job with reader arguments, and either succeeds or is
// refused with ErrDisagree naming every difference (want) and nothing
// else (not).
func TestJobsJoin(t *testing.T) {
	alice, bob := owner{uid: 1000}, owner{uid: 1001}
	aliceTCP := owner{uid: 1000, tcp: true}
	args := loader.ReaderArgs{BatchSize: 8, NumShards: 2, RandomShuffle: true, Seed: 12}
	with := func(f func(a *loader.ReaderArgs)) loader.ReaderArgs {
		a := args
		f(&a)
		return a
	}
	type step struct {
		who     owner
		job     string
		shard   int
		args    loader.ReaderArgs
		dataset string // "" means "train"; "copy" is train's fingerprint under another name, "val" another dataset
		id      string // the session; "" means one of its own
		leave   bool   // take the session id off the shard instead of joining
		want    []string
		not     []string
	}
	tests := []struct {
		name  string
		steps []step
		jobs  int // records left
	}{
		{"ranks that agree", []step{
			{who: alice, job: "j", shard: 0, args: args},
			{who: alice, job: "j", shard: 1, args: args},
		}, 1},
		{"seed", []step{
			{who: alice, job: "j", shard: 0, args: args},
			{who: alice, job: "j", shard: 1, args: with(func(a *loader.ReaderArgs) { a.Seed = 13 }),
				want: []string{`job "j"`, "shard_id 1", "seed 13 (the job's: 12)", "shards 0"}, not: []string{"num_shards", "batch_size"}},
		}, 1},
		{"num_shards", []step{
			{who: alice, job: "j", shard: 0, args: args},
			{who: alice, job: "j", shard: 1, args: with(func(a *loader.ReaderArgs) { a.NumShards = 4 }), want: []string{"num_shards 4 (the job's: 2)"}},
		}, 1},
		{"every difference at once", []step{
			{who: alice, job: "j", shard: 0, args: args},
			{who: alice, job: "j", shard: 1, dataset: "val", args: with(func(a *loader.ReaderArgs) {
				a.BatchSize, a.Seed, a.PadLastBatch, a.StickToShard, a.Shuffle = 16, 1, true, true, loader.ShuffleDALI
			}), want: []string{`dataset "val"`, `(the job's: "train", fingerprint`, "batch_size 16 (the job's: 8)", "shuffle dali (the job's: permute)",
				"pad_last_batch true (the job's: false)", "stick_to_shard true (the job's: false)"}},
		}, 1},
		{"another dataset's name, the same fingerprint", []step{
			{who: alice, job: "j", shard: 0, args: args},
			{who: alice, job: "j", shard: 1, args: args, dataset: "copy"},
		}, 1},
		{"random_shuffle", []step{
			{who: alice, job: "j", shard: 0, args: args},
			{who: alice, job: "j", shard: 1, args: with(func(a *loader.ReaderArgs) { a.RandomShuffle = false }),
				want: []string{"random_shuffle false (the job's: true)"}, not: []string{"seed"}},
		}, 1},
		{"seeds unshuffled change nothing", []step{
			{who: alice, job: "j", shard: 0, args: with(func(a *loader.ReaderArgs) { a.RandomShuffle, a.Seed = false, 12 })},
			{who: alice, job: "j", shard: 1, args: with(func(a *loader.ReaderArgs) { a.RandomShuffle, a.Seed = false, 13 })},
		}, 1},
		{"seeds and initial_fill change no rank's samples with the dali shuffle", []step{
			{who: alice, job: "p", shard: 0, args: with(func(a *loader.ReaderArgs) { a.InitialFill = 100 })},
			{who: alice, job: "p", shard: 1, args: with(func(a *loader.ReaderArgs) { a.InitialFill = 200 })},
			{who: alice, job: "d", shard: 0, args: with(func(a *loader.ReaderArgs) { a.Shuffle, a.InitialFill, a.Seed = loader.ShuffleDALI, 100, 12 })},
			{who: alice, job: "d", shard: 1, args: with(func(a *loader.ReaderArgs) { a.Shuffle, a.InitialFill, a.Seed = loader.ShuffleDALI, 200, 13 })},
		}, 2},
		{"defaults are the values they stand for", []step{
			{who: alice, job: "j", shard: 0, args: with(func(a *loader.ReaderArgs) { a.Shuffle, a.InitialFill = "", 0 })},
			{who: alice, job: "j", shard: 1, args: with(func(a *loader.ReaderArgs) { a.Shuffle, a.InitialFill = loader.ShufflePermute, 1024 })},
		}, 1},
		{"shuffle_after_epoch_seed", []step{
			{who: alice, job: "a", shard: 0, args: with(func(a *loader.ReaderArgs) { a.RandomShuffle, a.ShuffleAfterEpoch = false, true })},
			{who: alice, job: "a", shard: 1, args: with(func(a *loader.ReaderArgs) {
				a.RandomShuffle, a.ShuffleAfterEpoch, a.ShuffleAfterEpochSeed = false, true, new(int64(7))
			}), want: []string{"shuffle_after_epoch_seed 7 (the job's: 524287)"}},
			{who: alice, job: "a", shard: 1, args: with(func(a *loader.ReaderArgs) {
				a.RandomShuffle, a.ShuffleAfterEpoch, a.ShuffleAfterEpochSeed = false, true, new(int64(524287))
			})}, // the default given
			{who: alice, job: "u", shard: 0, args: with(func(a *loader.ReaderArgs) { a.ShuffleAfterEpochSeed = new(int64(1)) })},
			{who: alice, job: "u", shard: 1, args: with(func(a *loader.ReaderArgs) { a.ShuffleAfterEpochSeed = new(int64(2)) })},
		}, 2},
		{"duplicate shard_id", []step{
			{who: alice, job: "j", shard: 1, args: args, id: "first"},
			{who: alice, job: "j", shard: 1, args: args, want: []string{"shard_id 1 is already read by session first", "idle for 1m0s"}},
		}, 1},
		{"other owners' jobs are other jobs", []step{
			{who: alice, job: "j", shard: 0, args: args},
			{who: bob, job: "j", shard: 0, args: with(func(a *loader.ReaderArgs) { a.Seed = 99 })},
			{who: aliceTCP, job: "j", shard: 0, args: with(func(a *loader.ReaderArgs) { a.NumShards = 8 })},
			{who: bob, job: "j", shard: 1, args: args, want: []string{"seed 12 (the job's: 99)"}},
		}, 3},
		{"the last session takes the record", []step{
			{who: alice, job: "j", shard: 0, args: args, id: "a"},
			{who: alice, job: "j", shard: 1, args: args, id: "b"},
			{who: alice, job: "j", shard: 0, id: "a", leave: true},
			{who: alice, job: "j", shard: 0, args: with(func(a *loader.ReaderArgs) { a.Seed = 5 }), want: []string{"seed 5 (the job's: 12)", "shards 1"}},
			{who: alice, job: "j", shard: 1, id: "b", leave: true},
			{who: alice, job: "j", shard: 0, args: with(func(a *loader.ReaderArgs) { a.Seed = 5 })}, // a new job
		}, 1},
		{"a refused session leaves nothing", []step{
			{who: alice, job: "j", shard: 0, args: args, id: "a"},
			{who: alice, job: "j", shard: 1, args: with(func(a *loader.ReaderArgs) { a.Seed = 5 }), id: "b", want: []string{"seed"}},
			{who: alice, job: "j", shard: 1, id: "b", leave: true}, // not a member: no effect
			{who: alice, job: "j", shard: 0, id: "a", leave: true},
		}, 0},
		{"leave by another session of the shard is ignored", []step{
			{who: alice, job: "j", shard: 0, args: args, id: "a"},
			{who: alice, job: "j", shard: 0, id: "x", leave: true},
			{who: alice, job: "j", shard: 0, args: args, want: []string{"shard_id 0 is already read by session a"}},
		}, 1},
	}
	train := bmap.Map{Classes: []string{"a"}, Samples: []bmap.Sample{{Path: "a/1.jpg", Size: 10}}}
	val := bmap.Map{Classes: []string{"a"}, Samples: []bmap.Sample{{Path: "a/2.jpg", Size: 10}}}
	prints := map[string][2]string{"": {"train", train.Fingerprint()}, "copy": {"copy", train.Fingerprint()}, "val": {"val", val.Fingerprint()}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			js := newJobs(time.Minute)
			now := time.Unix(1000, 0)
			for i, s := range tc.steps {
				id := s.id
				if id == "" {
					id = "s" + string(rune('0'+i))
				}
				k := jobKey{s.who, s.job}
				if s.leave {
					js.leave(k, s.shard, id)
					continue
				}
				p := prints[s.dataset]
				err := js.join(k, termsOf(p[0], p[1], loader.Options{ReaderArgs: s.args}.WithDefaults().ReaderArgs), s.shard, id, now)
				if len(s.want) == 0 {
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					continue
				}
				if !errors.Is(err, ErrDisagree) {
					t.Fatalf("step %d: %v, want ErrDisagree", i, err)
				}
				for _, w := range s.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("step %d: %q does not say %q", i, err, w)
					}
				}
				for _, n := range s.not {
					if strings.Contains(err.Error(), n) {
						t.Errorf("step %d: %q names %q, which agrees", i, err, n)
					}
				}
			}
			if n := js.count(); n != tc.jobs {
				t.Errorf("%d job records left, want %d", n, tc.jobs)
			}
		})
	}
}

// TestOpenJob: the manager's opens join and leave jobs: a rank with
// another seed or a taken shard_id is refused with ErrDisagree before any
// batch memory is made, an open that fails after joining leaves no trace,
// closing and reaping take sessions off their job, and a fingerprint that
// is not the dataset's is refused with ErrConflict.
func TestOpenJob(t *testing.T) {
	ds := tree(t)
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}})
	defer m.Stop()
	me := Caller{UID: os.Getuid(), GID: os.Getgid()} // the owner of tree()
	open := func(shard int, seed uint64, more ...func(p *OpenParams)) (Opened, error) {
		p := OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, ShardID: shard, NumShards: 2, RandomShuffle: true, Seed: seed}}, JobID: "run-1"}
		for _, f := range more {
			f(&p)
		}
		return m.Open(context.Background(), me, p)
	}
	a, err := open(0, 12)
	if err != nil {
		t.Fatal(err)
	}
	if a.Fingerprint != ds.Fingerprint() {
		t.Errorf("open's fingerprint %q, want the dataset's %q", a.Fingerprint, ds.Fingerprint())
	}
	if _, err := open(1, 13); !errors.Is(err, ErrDisagree) || !strings.Contains(err.Error(), "seed 13 (the job's: 12)") {
		t.Errorf("a rank with another seed: %v, want ErrDisagree naming seed", err)
	}
	if _, err := open(0, 12); !errors.Is(err, ErrDisagree) || !strings.Contains(err.Error(), "shard_id 0 is already read by session "+a.ID) {
		t.Errorf("a second rank on shard 0: %v, want ErrDisagree naming the shard and session", err)
	}
	// An open that joins, then fails (an unknown backend): no member left.
	if _, err := open(1, 12, func(p *OpenParams) { p.Backend = "nope" }); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown backend: %v, want ErrInvalid", err)
	}
	if _, err := open(1, 12); err != nil {
		t.Fatalf("rank 1 after a failed open of shard 1: %v", err)
	}
	if n := len(m.jobs.m[jobKey{me.owner(), "run-1"}].shards); n != 2 {
		t.Errorf("job has %d members, want 2", n)
	}
	// Without a job, or in another one, nothing is compared.
	if _, err := open(0, 99, func(p *OpenParams) { p.JobID = "" }); err != nil {
		t.Errorf("no job_id: %v", err)
	}
	if _, err := open(0, 99, func(p *OpenParams) { p.JobID = "run-2" }); err != nil {
		t.Errorf("another job: %v", err)
	}
	// The fingerprint asked for: the dataset's passes, another is refused.
	if _, err := open(0, 1, func(p *OpenParams) { p.JobID, p.Fingerprint = "", a.Fingerprint }); err != nil {
		t.Errorf("the dataset's own fingerprint: %v", err)
	}
	other := strings.Repeat("0", bmap.FingerprintLen)
	if _, err := open(0, 1, func(p *OpenParams) { p.JobID, p.Fingerprint = "", other }); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "fingerprint "+a.Fingerprint) {
		t.Errorf("another fingerprint: %v, want ErrConflict naming both", err)
	}
	// Closing the job's sessions takes its record; a reaped one too.
	if err := m.Close(me, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := open(0, 13); !errors.Is(err, ErrDisagree) {
		t.Errorf("after rank 0 closed, rank 1 still sets the job's terms: %v, want ErrDisagree", err)
	}
	m.Reap(time.Now().Add(time.Hour)) // every session idle
	if n := m.jobs.count(); n != 0 {
		t.Errorf("%d job records after every session was reaped, want 0", n)
	}
	if _, err := open(0, 13); err != nil {
		t.Errorf("a new job under the same id: %v", err)
	}
}

// TestJobsBoundedAndOwned: the registry as an attacker would use it. An
// owner at its session limit sending opens under ever new job_ids grows
// nothing (each is refused with ErrLimit and leaves no record); another
// owner's job of the same job_id is never compared with it; the daemon's
// stop leaves no record.
func TestJobsBoundedAndOwned(t *testing.T) {
	ds := tree(t)
	const perUID = 3
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}, MaxSessionsPerUID: perUID})
	me := Caller{UID: os.Getuid(), GID: os.Getgid()}
	tcp := me
	tcp.TCP = true // another owner, reading as the same uid
	open := func(c Caller, job string, shard int, seed uint64) error {
		_, err := m.Open(context.Background(), c, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, ShardID: shard, NumShards: 2, RandomShuffle: true, Seed: seed}}, JobID: job})
		return err
	}
	for i := range perUID {
		if err := open(me, fmt.Sprintf("job-%d", i), 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 500 {
		if err := open(me, fmt.Sprintf("flood-%d", i), 0, 1); !errors.Is(err, ErrLimit) {
			t.Fatalf("open %d past the limit: %v, want ErrLimit", i, err)
		}
	}
	if n := m.jobs.count(); n != perUID {
		t.Errorf("%d job records after 500 refused opens, want %d (one per open session)", n, perUID)
	}
	// Another owner's job-0, with other terms and the same shard: its own.
	if err := open(tcp, "job-0", 0, 99); err != nil {
		t.Errorf("another owner's job of the same id: %v", err)
	}
	if err := open(tcp, "job-0", 1, 98); !errors.Is(err, ErrDisagree) || !strings.Contains(err.Error(), "seed 98 (the job's: 99)") {
		t.Errorf("its own second rank: %v, want ErrDisagree against its own job's seed 99", err)
	}
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := m.jobs.count(); n != 0 {
		t.Errorf("%d job records after Stop, want 0", n)
	}
}
