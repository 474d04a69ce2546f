// SPDX-License-Identifier: Apache-2.0

// Package wds maps WebDataset tar shards into samples exactly as DALI's
// fn.readers.webdataset forms them, and stores the result as a version 3
// block map whose records are read in place from a copy of the file.
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
// any ext, as DALI's reader does from one set of shards. Unlike DALI it
// refuses an ext entry that no extension of the map fills (ErrNoMatch,
// naming the map's extensions), and counts the samples skip leaves out
// (View.Skipped).
//
// Scale (TestScale with NVFEED_WDS_SAMPLES=1000000, 1.9 components a
// sample, 100 shards, on the 2-core development VM): the map is 75.5
// bytes a sample (24 per sample record, 24 per component, the key);
// Open copies it into the process's own read-only memory, checks every
// record and indexes the samples by pattern (index.go): 100 ms, 72 MiB
// for the copy and 5.3 MiB for the index (4 bytes a sample, and each
// pattern's largest rooms), so about 10 s, 7.6 GB and 400 MB at 100 M
// samples; a sample's lookup reads its records in place without
// allocating; Select judges each pattern once and reads no record (6
// µs with empty), and with skip that leaves samples out fills one bit
// per sample from the index (1.1 ms and 129 KiB at 1 M).
// Building reads each member's header: 48 500 samples/s of two members
// from the page cache (mkbmap over 20 shards of 5000), so about 35
// minutes for 100 M samples, one shard at a time.
package wds
