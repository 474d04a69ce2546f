// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"fmt"
	"sort"
)

// MaxStages bounds the stages of a resumed state.
const MaxStages = 64

// Stage is one interrupted run of a resumed epoch. Its ranks read
// NumShards shards of the epoch's list at the time, in batches of
// BatchSize, and each had received Batch batches.
//
// A resume on other shards or another batch size starts a resumed epoch.
// Its list is what was not delivered: for each old shard in order, the
// samples past its first Batch·BatchSize. The new ranks shard that list
// as any epoch's. A resume of a resumed epoch adds a stage. A stage holds
// three numbers, never samples: a state is small whatever N.
type Stage struct {
	NumShards int `json:"num_shards" msgpack:"num_shards"` // the run's ranks
	BatchSize int `json:"batch_size" msgpack:"batch_size"` // the run's batch size
	Batch     int `json:"batch" msgpack:"batch"`           // the batches every rank had received
}

// resumed is a Sampling's resumed epoch: its number and stages.
type resumed struct {
	epoch  int
	stages []Stage
	lens   []int // the list's length before each stage, then after the last
}

// left returns the length of the list after the stage, over a list of n.
// Every shard holds n/NumShards samples, or one more.
func (st Stage) left(n int) int {
	c := st.Batch * st.BatchSize
	if c > n/st.NumShards {
		return 0
	}
	return n - st.NumShards*c
}

// back returns the position in the list before the stage (of n) of
// position j in the list after it, and how many positions from there on
// follow in both lists (to the end of the old shard).
func (st Stage) back(n, j int) (p, run int) {
	c, w := st.Batch*st.BatchSize, st.NumShards
	before := func(k int) int { return k*n/w - k*c } // samples left in shards before k
	k := sort.Search(w, func(k int) bool { return before(k+1) > j })
	p = k*n/w + c + j - before(k)
	return p, (k+1)*n/w - p
}

// Resumed returns s with epoch resumed through stages: s itself without
// stages. Its epoch's list is the stages' remainder (see Stage).
func (s Sampling) Resumed(epoch int, stages []Stage) Sampling {
	if len(stages) == 0 {
		s.resume = nil
		return s
	}
	r := &resumed{epoch: epoch, stages: stages, lens: []int{s.N}}
	for _, st := range stages {
		r.lens = append(r.lens, st.left(r.lens[len(r.lens)-1]))
	}
	s.resume = r
	return s
}

// Stages returns the stages of epoch, nil where it is not resumed.
func (s Sampling) Stages(epoch int) []Stage {
	if s.resume == nil || s.resume.epoch != epoch {
		return nil
	}
	return s.resume.stages
}

// epochLen returns the length of epoch's list: N, or the remainder of a
// resumed epoch.
func (s Sampling) epochLen(epoch int) int {
	if r := s.resume; r != nil && r.epoch == epoch {
		return r.lens[len(r.lens)-1]
	}
	return s.N
}

// origin returns the position in the epoch's full list of position q of
// its list (the same but in a resumed epoch).
func (s Sampling) origin(epoch, q int) int {
	r := s.resume
	if r == nil || r.epoch != epoch {
		return q
	}
	for i := len(r.stages) - 1; i >= 0; i-- {
		q, _ = r.stages[i].back(r.lens[i], q)
	}
	return q
}

// spans calls f, in order, for each run of consecutive positions of the
// epoch's full list that positions [a, b) of its list are: one run but in
// a resumed epoch. A shard costs its samples plus a search per old shard
// it spans.
func (s Sampling) spans(epoch, a, b int, f func(p, n int)) {
	r := s.resume
	if r == nil || r.epoch != epoch {
		f(a, b-a)
		return
	}
	var walk func(i, a, b int)
	walk = func(i, a, b int) {
		if i < 0 {
			f(a, b-a)
			return
		}
		for a < b {
			p, run := r.stages[i].back(r.lens[i], a)
			run = min(run, b-a)
			walk(i-1, p, p+run)
			a += run
		}
	}
	walk(len(r.stages)-1, a, b)
}

// checkStages checks stages for a resume of s: a sampling whose list is
// the same whatever the shards, stages in bounds, each at most past its
// largest shard's end. Errors wrap ErrOptions and say what to do.
func (s Sampling) checkStages(stages []Stage) error {
	if len(stages) == 0 {
		return nil
	}
	if len(stages) > MaxStages {
		return fmt.Errorf("%w: saved state has %d stages, at most %d: start the epoch afresh", ErrOptions, len(stages), MaxStages)
	}
	var why string
	switch {
	case s.ShuffleAfterEpoch:
		why = "shuffle_after_epoch"
	case s.RandomShuffle && s.Shuffle == ShuffleDALI:
		why = `shuffle="dali" (each shard's own buffer order)`
	case s.StickToShard:
		why = "stick_to_shard (each rank keeps its shard's samples)"
	}
	if why != "" {
		return fmt.Errorf("%w: a resume on other num_shards or batch_size cannot be exact with %s: resume with the saved num_shards and batch_size, or start the next epoch afresh", ErrOptions, why)
	}
	n := s.N
	for i, st := range stages {
		if st.NumShards < 1 || st.NumShards > MaxSamples || st.BatchSize < 1 || st.BatchSize > MaxBatchSize {
			return fmt.Errorf("%w: saved state stage %d: num_shards %d, batch_size %d out of bounds", ErrOptions, i, st.NumShards, st.BatchSize)
		}
		if most := (n/st.NumShards + 1 + st.BatchSize - 1) / st.BatchSize; st.Batch < 0 || st.Batch > most {
			return fmt.Errorf("%w: saved state stage %d: batch %d not in [0, %d] (its largest shard's batches)", ErrOptions, i, st.Batch, most)
		}
		n = st.left(n)
	}
	return nil
}
