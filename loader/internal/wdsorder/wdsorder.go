// SPDX-License-Identifier: Apache-2.0

// Package wdsorder reproduces the order in which DALI's
// fn.readers.webdataset returns samples, epoch by epoch, for one shard:
// fn.readers.file's reader (package daliorder: the shard walk,
// stick_to_shard, the initial_fill buffer and its generator,
// pad_last_batch) over the samples in shard and member order, without
// the file list's fixed permutation, which fn.readers.webdataset's
// loader does not make. A sample index is a sample's position in the
// map's order (bmap/wds: shards in order, each in tar order, after
// Select). Checked against real DALI 2.4 in its testdata.
package wdsorder

import "github.com/nvfeed/nvfeed/loader/internal/daliorder"

// Params are the reader's arguments, with fn.readers.webdataset's names
// (daliorder.Params; ListOrder is set by New).
type Params = daliorder.Params

// New returns a reader of fn.readers.webdataset's order at the start of
// epoch 0. p must be valid as daliorder.New's.
func New(p Params) *daliorder.Reader {
	p.ListOrder = true
	return daliorder.New(p)
}

// Bytes returns the memory a reader for p holds: its buffer alone
// (InitialFill int32s with RandomShuffle, else one), whatever N.
func Bytes(p Params) int64 {
	p.ListOrder = true
	return daliorder.Bytes(p)
}
