// SPDX-License-Identifier: Apache-2.0

package session

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nvfeed/nvfeed/loader"
)

// Jobs: the sessions naming one job_id are the ranks of one job on this node.
// They must read one dataset with the same sampling, each its own shard.
// The first session sets the terms; a later one that differs gets ErrDisagree.
// A job belongs to its owner and goes with its last session.

// MaxJobID bounds job_id: bytes of UTF-8, no control characters.
const MaxJobID = 128

// jobKey names a job: its owner and its id.
type jobKey struct {
	owner owner
	id    string
}

// jobTerms is what a job's sessions must agree on: the dataset and the sampling.
// Arguments that change no rank's samples are left zero.
type jobTerms struct {
	dataset, fingerprint string
	batchSize, numShards int
	randomShuffle        bool
	shuffle              string
	seed                 uint64
	padLastBatch         bool
	stickToShard         bool
	shuffleAfterEpoch    bool
	afterEpochSeed       int64  // shuffle_after_epoch_seed, with shuffleAfterEpoch
	files                string // files=: "" for the whole dataset, else the list's count and hash
	selection            string // a webdataset's ext selection (selectionTerm)
}

// withFiles returns t for a session that reads the samples files lists
// (nil: the whole dataset): ranks of a job must read the same list.
func (t jobTerms) withFiles(files []int32) jobTerms {
	if files == nil {
		return t
	}
	h := fnv.New64a()
	var b [4]byte
	for _, s := range files {
		binary.LittleEndian.PutUint32(b[:], uint32(s))
		h.Write(b[:])
	}
	t.files = fmt.Sprintf("a list of %d (hash %016x)", len(files), h.Sum64())
	return t
}

// termsOf returns the terms of a session reading dataset (its name and
// fingerprint) with reader arguments a, their defaults filled in.
func termsOf(dataset, fingerprint string, a loader.ReaderArgs) jobTerms {
	t := jobTerms{dataset: dataset, fingerprint: fingerprint, batchSize: a.BatchSize, numShards: a.NumShards,
		randomShuffle: a.RandomShuffle, padLastBatch: a.PadLastBatch, stickToShard: a.StickToShard,
		shuffleAfterEpoch: a.ShuffleAfterEpoch}
	if a.ShuffleAfterEpoch {
		t.afterEpochSeed = a.AfterEpochSeed()
	}
	if a.RandomShuffle {
		t.shuffle = a.Shuffle
		if a.Shuffle != loader.ShuffleDALI {
			t.seed = a.Seed
		}
	}
	return t
}

// diff names every term in which t (a new session's) differs from the
// job's j, the job's value in parentheses; nil when they agree.
func (t jobTerms) diff(j jobTerms) []string {
	var d []string
	add := func(name string, v, jv any) {
		if v != jv {
			d = append(d, fmt.Sprintf("%s %v (the job's: %v)", name, v, jv))
		}
	}
	if t.fingerprint != j.fingerprint {
		d = append(d, fmt.Sprintf("dataset %q, fingerprint %s (the job's: %q, fingerprint %s)", t.dataset, t.fingerprint, j.dataset, j.fingerprint))
	}
	add("batch_size", t.batchSize, j.batchSize)
	add("num_shards", t.numShards, j.numShards)
	add("random_shuffle", t.randomShuffle, j.randomShuffle)
	if t.randomShuffle && j.randomShuffle {
		add("shuffle", t.shuffle, j.shuffle)
		if t.shuffle == j.shuffle {
			add("seed", t.seed, j.seed)
		}
	}
	add("pad_last_batch", t.padLastBatch, j.padLastBatch)
	add("stick_to_shard", t.stickToShard, j.stickToShard)
	add("shuffle_after_epoch", t.shuffleAfterEpoch, j.shuffleAfterEpoch)
	add("shuffle_after_epoch_seed", t.afterEpochSeed, j.afterEpochSeed)
	if t.files != j.files {
		d = append(d, fmt.Sprintf("files %s (the job's: %s)", orAll(t.files), orAll(j.files)))
	}
	add("ext, case_sensitive_extensions, missing_component_behavior", t.selection, j.selection)
	return d
}

// orAll names a jobTerms.files: "" is the whole dataset.
func orAll(files string) string {
	if files == "" {
		return "the whole dataset"
	}
	return files
}

// job is one job's record: its terms and the sessions reading each shard.
type job struct {
	terms  jobTerms
	shards map[int]jobMember // by shard_id
}

// jobMember is the session reading a shard of a job.
type jobMember struct {
	session string
	since   time.Time
}

// jobs is the job registry. A job exists while one of its sessions does,
// so there are at most as many as sessions (Config.MaxSessions).
type jobs struct {
	idle time.Duration // the session timeout, for messages

	mu sync.Mutex
	m  map[jobKey]*job // under mu
}

func newJobs(idle time.Duration) *jobs { return &jobs{idle: idle, m: map[jobKey]*job{}} }

// join adds session id reading shard to job k; the first session sets the terms.
// A session differing from them, or reading a taken shard, gets ErrDisagree.
func (js *jobs) join(k jobKey, t jobTerms, shard int, id string, now time.Time) error {
	js.mu.Lock()
	defer js.mu.Unlock()
	j := js.m[k]
	if j == nil {
		js.m[k] = &job{terms: t, shards: map[int]jobMember{shard: {id, now}}}
		return nil
	}
	if d := t.diff(j.terms); len(d) > 0 {
		return fmt.Errorf("%w: job %q: shard_id %d would read with %s: every rank of a job must read one dataset with the same sampling (%d session(s) of the job are open, shards %s)",
			ErrDisagree, k.id, shard, strings.Join(d, ", "), len(j.shards), shardList(j.shards))
	}
	if other, ok := j.shards[shard]; ok {
		return fmt.Errorf("%w: job %q: shard_id %d is already read by session %s (opened %s ago): two ranks with one shard_id read the same samples, and a shard no rank reads is never seen; a rank that died leaves its session open until it has been idle for %s",
			ErrDisagree, k.id, shard, other.session, now.Sub(other.since).Round(time.Second), js.idle)
	}
	j.shards[shard] = jobMember{id, now}
	return nil
}

// leave takes session id off shard of job k; the job's last session
// takes the job's record with it.
func (js *jobs) leave(k jobKey, shard int, id string) {
	js.mu.Lock()
	defer js.mu.Unlock()
	j := js.m[k]
	if j == nil || j.shards[shard].session != id {
		return
	}
	delete(j.shards, shard)
	if len(j.shards) == 0 {
		delete(js.m, k)
	}
}

// count returns how many jobs have a record.
func (js *jobs) count() int {
	js.mu.Lock()
	defer js.mu.Unlock()
	return len(js.m)
}

// shardList lists a job's shards in order, for messages: "0, 1, 3".
func shardList(shards map[int]jobMember) string {
	ids := make([]int, 0, len(shards))
	for s := range shards {
		ids = append(ids, s)
	}
	slices.Sort(ids)
	var b strings.Builder
	for i, s := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprint(&b, s)
	}
	return b.String()
}
