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
//   - Seed is any uint64: it only seeds the PCG (ShuffleDALI: its low 32
//     bits seed DALI's generator).
//   - 1 <= InitialFill <= MaxInitialFill: ShuffleDALI's buffer holds that
//     many sample indices (64 MiB at most).
//   - ShuffleDALI with RandomShuffle reaches epoch e by replaying the
//     epochs before it: e·ceil(N/NumShards) <= MaxReplaySamples for a
//     resumed state or a requested position (their padding costs
//     nothing). Measured on the development VM: 22 ns a sample with the
//     default InitialFill, 56 ns with MaxInitialFill (a buffer past the
//     caches): 24 to 60 s of a core at the bound. A replay stops with its
//     producer (Close, a seek elsewhere) and runs in a turn of
//     Options.Replays. The producer goes on past it epoch by epoch,
//     replaying nothing.
const (
	MaxBatchSize = 1 << 16       // batch_size: samples per batch
	MaxSamples   = math.MaxInt32 // samples in a dataset (indices are int32); num_shards is at most the samples
	MaxEpoch     = math.MaxInt32 // epoch of a requested position or a resumed state
	MaxIteration = math.MaxInt32 // iteration (batch) of a requested position or a resumed state

	DefaultInitialFill = 1024    // initial_fill when 0: fn.readers.file's default
	MaxInitialFill     = 1 << 24 // initial_fill: ShuffleDALI's buffer, in samples
	MaxReplaySamples   = 1 << 30 // samples ShuffleDALI replays to reach a resumed or requested epoch
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
	case a.Shuffle != "" && a.Shuffle != ShufflePermute && a.Shuffle != ShuffleDALI:
		return fmt.Errorf("%w: shuffle %q (want %q or %q; \"\" means %q)", ErrOptions, a.Shuffle, ShufflePermute, ShuffleDALI, ShufflePermute)
	case a.InitialFill < 0 || a.InitialFill > MaxInitialFill:
		return fmt.Errorf("%w: initial_fill %d not in [1, %d] (0 means %d)", ErrOptions, a.InitialFill, MaxInitialFill, DefaultInitialFill)
	case a.ShuffleAfterEpoch && a.RandomShuffle:
		return fmt.Errorf("%w: shuffle_after_epoch and random_shuffle cannot both be true (as in DALI): pass one", ErrOptions)
	case a.ShuffleAfterEpoch && a.StickToShard:
		return fmt.Errorf("%w: shuffle_after_epoch and stick_to_shard cannot both be true (as in DALI; shuffle_after_epoch keeps the shard_id's range of each epoch's list)", ErrOptions)
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
	case s.WebDataset && s.ShuffleAfterEpoch:
		return fmt.Errorf("%w: shuffle_after_epoch is not served for a webdataset dataset: use random_shuffle", ErrOptions)
	}
	return s.ReaderArgs.Validate()
}

// checkReplay checks that reaching epoch e replays at most
// MaxReplaySamples samples: ShuffleDALI's order of an epoch depends on
// every epoch before it, and ShuffleAfterEpoch's list on every shuffle
// before it (N samples an epoch). Other orders are a function of the
// epoch alone.
func (s Sampling) checkReplay(epoch int) error {
	if !s.daliShuffled() || s.NumShards < 1 {
		return nil
	}
	per, how := int64(s.N+s.NumShards-1)/int64(s.NumShards), fmt.Sprintf("shuffle %q", ShuffleDALI)
	if s.ShuffleAfterEpoch {
		per, how = max(int64(s.N), 1), "shuffle_after_epoch"
	}
	if int64(epoch) > MaxReplaySamples/per {
		return fmt.Errorf("%w: epoch %d with %s: reaching it replays the %d epochs before it, %d samples each, over the limit of %d samples (epoch %d at most)",
			ErrOptions, epoch, how, epoch, per, MaxReplaySamples, MaxReplaySamples/per)
	}
	return nil
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
// [0, EpochBatches(epoch)], with ShuffleDALI at most MaxReplaySamples to
// replay). Whether it fits a dataset and options is New's check. Errors
// wrap ErrOptions.
func (st *State) Validate() error {
	if err := st.checkVersion(); err != nil {
		return err
	}
	if err := st.Sampling.Validate(); err != nil {
		return fmt.Errorf("%w (in the saved state's sampling)", err)
	}
	if st.Epoch < 0 || st.Epoch > MaxEpoch {
		return fmt.Errorf("%w: saved state epoch %d not in [0, %d]", ErrOptions, st.Epoch, MaxEpoch)
	}
	if err := st.Sampling.checkStages(st.Stages); err != nil {
		return err
	}
	if nb := st.Sampling.Resumed(st.Epoch, st.Stages).EpochBatches(st.Epoch); st.Batch < 0 || st.Batch > nb {
		return fmt.Errorf("%w: saved state batch %d not in [0, %d] (the batches of epoch %d)", ErrOptions, st.Batch, nb, st.Epoch)
	}
	if err := st.Sampling.checkReplay(st.Epoch); err != nil {
		return fmt.Errorf("%w (the saved state's)", err)
	}
	return nil
}

// checkVersion accepts StateVersion, version 2 (no stages), and version 1
// where its sequence is unchanged: every sampling but RandomShuffle with
// StickToShard over several shards, whose permutation now keeps DALI's
// shard (version 1 had no shuffle or initial_fill: they are the defaults).
func (st *State) checkVersion() error {
	s := st.Sampling
	switch {
	case st.Version == StateVersion, st.Version == 2 && len(st.Stages) == 0:
		return nil
	case st.Version == 1 && s.RandomShuffle && s.StickToShard && s.NumShards > 1:
		return fmt.Errorf("%w: saved state has version 1, whose random_shuffle with stick_to_shard read other samples (this loader keeps DALI's shard every epoch): start afresh", ErrOptions)
	case st.Version == 1 && s.Shuffle == "" && s.InitialFill == 0:
		return nil
	}
	return fmt.Errorf("%w: saved state has version %d, this loader reads version %d (and 2, 1)", ErrOptions, st.Version, StateVersion)
}
