// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"fmt"
	"reflect"
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
	if err := s.checkDataset(); err != nil {
		return err
	}
	return s.ReaderArgs.Validate()
}

// checkDataset checks what the dataset bounds: its samples, num_shards
// and a webdataset's shuffle.
func (s Sampling) checkDataset() error {
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
	return nil
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
	if st.Content != nil {
		if err := st.Content.Validate(); err != nil {
			return fmt.Errorf("%w: the saved state's content: %w", ErrOptions, err)
		}
	}
	return nil
}

// checkVersion accepts StateVersion, version 3, version 2 (no stages),
// and version 1 where its sequence is unchanged: every sampling but
// RandomShuffle with StickToShard over several shards, whose permutation
// now keeps DALI's shard (version 1 had no shuffle or initial_fill: they
// are the defaults). Versions 1 to 3 keep the listed permutation
// (StateVersion).
func (st *State) checkVersion() error {
	s := st.Sampling
	switch {
	case st.Version == StateVersion, st.Version == ListedVersion, st.Version == 2 && len(st.Stages) == 0:
		return nil
	case st.Version == 1 && s.RandomShuffle && s.StickToShard && s.NumShards > 1:
		return fmt.Errorf("%w: saved state has version 1, whose random_shuffle with stick_to_shard read other samples (this loader keeps DALI's shard every epoch): start afresh", ErrOptions)
	case st.Version == 1 && s.Shuffle == "" && s.InitialFill == 0:
		return nil
	}
	return fmt.Errorf("%w: saved state has version %d, this loader reads version %d (and 3, 2, 1)", ErrOptions, st.Version, StateVersion)
}

// checkState checks that st, valid on its own (Options.Validate), was
// saved with sampling smp.
func checkState(st *State, smp Sampling) error {
	saved := st.Sampling
	saved.ReaderArgs = saved.ReaderArgs.withDefaults() // version 1 had no shuffle, initial_fill
	if d := saved.diff(smp); d != "" {
		return fmt.Errorf("loader: %w: saved state was made with other options: %s", ErrOptions, d)
	}
	return nil
}

// Check returns o with its defaults filled in (WithDefaults) and checked
// (Validate). NewPlan takes the options it returns as they are unless a
// field Validate reads has changed since.
func (o Options) Check() (Options, error) {
	if o.checked != nil && reflect.DeepEqual(*o.checked, o.fields()) {
		return o, nil
	}
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return Options{}, err
	}
	f := o.fields()
	o.checked = &f
	return o, nil
}

// Validate checks o (defaults filled in: WithDefaults) against every
// bound that needs no dataset. Those are the reader arguments, the
// prefetch depth, release_after and slots, the memory kind, the GPU path
// with the memory and the backend named, and a resume state on its own.
// Errors wrap ErrOptions and name the field, its value and what is
// allowed.
func (o Options) Validate() error {
	if err := o.ReaderArgs.Validate(); err != nil {
		return err
	}
	if err := checkPrefetch(o.PrefetchQueueDepth); err != nil {
		return err
	}
	if o.ReleaseAfter < 0 || o.ReleaseAfter > MaxReleaseAfter {
		return fmt.Errorf("%w: release_after %d not in [0, %d]", ErrOptions, o.ReleaseAfter, MaxReleaseAfter)
	}
	if o.Slots <= o.PrefetchQueueDepth {
		return fmt.Errorf("%w: %d slots cannot hold %d prefetched batches and one in use", ErrOptions, o.Slots, o.PrefetchQueueDepth)
	}
	if err := o.Memory.Check(); err != nil {
		return fmt.Errorf("%w: %w", ErrOptions, err)
	}
	if err := checkDeviceUUID(o.DeviceUUID); err != nil {
		return err
	}
	if o.ROI != nil {
		if err := o.ROI.Validate(); err != nil {
			return err
		}
		if o.Memory.OnGPU() {
			return fmt.Errorf("%w: a region of interest (roi_*) is read into host memory only, not memory %s", ErrOptions, o.Memory)
		}
	}
	if o.State != nil {
		if err := o.State.Validate(); err != nil {
			return fmt.Errorf("state: %w", err)
		}
	}
	_, err := chooseWays(nil, o)
	return err
}
