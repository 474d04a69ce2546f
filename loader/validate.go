// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"fmt"
	"math"
)

// Bounds on the sampling numbers a client sends (the daemon's open
// request, a resume State, a requested position). They keep every sum and
// product of the sampler's arithmetic inside int64:
//
//   - N <= MaxSamples = 2^31-1 (sample indices are int32), and
//     1 <= NumShards <= N, 0 <= ShardID < NumShards: ShardRange computes
//     (k+1)·N with k < NumShards, at most 2^31·2^31 = 2^62.
//   - EpochSamples is at most ceil(N/NumShards) rounded up to a whole
//     batch: N + MaxBatchSize < 2^32; EpochBatches is at most that.
//   - batch·BatchSize (the producer's slice of the epoch order) is at most
//     2^32·2^16 = 2^48.
//   - 0 <= Epoch <= MaxEpoch = 2^31-1: Shard computes ShardID+epoch, at
//     most 2^32; the epoch after the last one asked for (NextAt's end of
//     epoch, a resumed end of epoch) is 2^31. The producer counts epochs on
//     from there one per pass over the data: 2^63 is never reached.
//   - 0 <= Iteration <= MaxIteration = 2^31-1: it is only compared with
//     EpochBatches (a larger one asks for the end of the epoch).
//   - Seed is any uint64: it only seeds the PCG.
const (
	MaxBatchSize = 1 << 16       // batch_size: samples per batch
	MaxSamples   = math.MaxInt32 // samples in a dataset (indices are int32); num_shards is at most the samples
	MaxEpoch     = math.MaxInt32 // epoch of a requested position or a resumed state
	MaxIteration = math.MaxInt32 // iteration (batch) of a requested position or a resumed state
)

// Validate checks the dataset-independent reader arguments as a request
// carries them (NumShards 0 means 1). Errors wrap ErrOptions and name the
// field, its value and the allowed range.
func (a ReaderArgs) Validate() error {
	shards := a.NumShards
	if shards == 0 {
		shards = 1
	}
	switch {
	case a.BatchSize < 1 || a.BatchSize > MaxBatchSize:
		return fmt.Errorf("%w: batch_size %d not in [1, %d]", ErrOptions, a.BatchSize, MaxBatchSize)
	case shards < 1 || shards > MaxSamples:
		return fmt.Errorf("%w: num_shards %d not in [1, %d] (0 means 1)", ErrOptions, a.NumShards, MaxSamples)
	case a.ShardID < 0 || a.ShardID >= shards:
		return fmt.Errorf("%w: shard_id %d not in [0, num_shards=%d)", ErrOptions, a.ShardID, shards)
	}
	return nil
}

// Validate checks the sampling options against the bounds above.
func (s Sampling) Validate() error {
	switch {
	case s.N <= 0:
		return fmt.Errorf("%w: the dataset has no samples", ErrOptions)
	case s.N > MaxSamples:
		return fmt.Errorf("%w: %d samples, over the limit of %d", ErrOptions, s.N, MaxSamples)
	case s.NumShards < 1 || s.NumShards > s.N:
		return fmt.Errorf("%w: num_shards %d not in [1, %d] (at most the dataset's samples)", ErrOptions, s.NumShards, s.N)
	}
	return s.ReaderArgs.Validate()
}

// CheckPosition checks a batch position a client names: epoch in
// [0, MaxEpoch], iteration in [0, MaxIteration]. Errors wrap ErrOptions.
func CheckPosition(epoch, iteration int) error {
	if epoch < 0 || epoch > MaxEpoch {
		return fmt.Errorf("%w: epoch %d not in [0, %d]", ErrOptions, epoch, MaxEpoch)
	}
	if iteration < 0 || iteration > MaxIteration {
		return fmt.Errorf("%w: iteration %d not in [0, %d]", ErrOptions, iteration, MaxIteration)
	}
	return nil
}

// Validate checks a saved state on its own: its version, its sampling,
// and its position (epoch in [0, MaxEpoch], batch in
// [0, EpochBatches(epoch)]). Whether it fits a dataset and options is
// New's check. Errors wrap ErrOptions.
func (st *State) Validate() error {
	if st.Version != StateVersion {
		return fmt.Errorf("%w: saved state has version %d, this loader reads version %d", ErrOptions, st.Version, StateVersion)
	}
	if err := st.Sampling.Validate(); err != nil {
		return fmt.Errorf("%w (in the saved state's sampling)", err)
	}
	if st.Epoch < 0 || st.Epoch > MaxEpoch {
		return fmt.Errorf("%w: saved state epoch %d not in [0, %d]", ErrOptions, st.Epoch, MaxEpoch)
	}
	if nb := st.Sampling.EpochBatches(st.Epoch); st.Batch < 0 || st.Batch > nb {
		return fmt.Errorf("%w: saved state batch %d not in [0, %d] (the batches of epoch %d)", ErrOptions, st.Batch, nb, st.Epoch)
	}
	return nil
}
