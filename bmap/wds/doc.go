// SPDX-License-Identifier: Apache-2.0

// Package wds maps WebDataset tar shards into samples exactly as DALI's
// fn.readers.webdataset forms them, and stores the result as a version 3
// block map that is read in place.
//
// Reading: ReadTar lists a shard's regular members as DALI's TarArchive
// (libtar) does; GroupMembers groups them into samples by key (SplitName,
// the first dot after the last slash), in tar order; Build does both for
// every shard, in the order given (DALI's paths; Discover sorts a
// folder's .tar files bytewise) or from DALI's index_paths (wds2idx),
// and maps each tar's extents (bmap.Build of the tars). A component is
// its member's data: a byte range of the tar starting on a 512-byte
// block, so tar headers and padding are never part of one.
//
// Where ext applies: the map keeps every member's component with its
// extension; Map.Select applies fn.readers.webdataset's ext (';'
// alternatives), case_sensitive_extensions and
// missing_component_behavior when the map is opened, so one map serves
// any ext, as DALI's reader does from one set of shards.
//
// Scale (TestScale with NVFEED_WDS_SAMPLES=100000000, 1.9 components a
// sample, 10 000 shards, on the 2-core development VM): the map is 77.5
// bytes a sample (7.75 GB for 100 M samples: 24 per sample record, 24
// per component, the key); Open maps it and decodes the shards alone: 6
// ms and 1.4 MiB of heap, whatever the number of samples; a sample's
// lookup reads its records in place without allocating; Select with
// skip or error reads every record once (30 s for 100 M) and keeps one
// bit per sample (12.7 MiB) when some are skipped, nothing otherwise.
// Building reads each member's header: 48 500 samples/s of two members
// from the page cache (mkbmap over 20 shards of 5000), so about 35
// minutes for 100 M samples, one shard at a time.
package wds
