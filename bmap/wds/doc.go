// SPDX-License-Identifier: Apache-2.0

// Package wds maps WebDataset tar shards into samples exactly as DALI's
// fn.readers.webdataset forms them. It stores the result as a version 3
// block map. The map's records are read in place from a copy of the file.
//
// Reading. ReadTar lists a shard's regular members as DALI's TarArchive
// (libtar) does. GroupMembers groups them into samples by key, in tar
// order. The key ends at the first dot after the last slash (SplitName).
// Build does both for every shard, and maps each tar's extents with
// bmap.Build. Shards come in the order given, as DALI's paths do, or from
// DALI's index_paths (wds2idx). Discover sorts a folder's .tar files
// bytewise. A component is its member's data: a byte range of the tar that
// starts on a 512-byte block. Tar headers and padding are never part of
// one.
//
// Where ext applies. The map keeps every member's component with its
// extension. Map.Select applies fn.readers.webdataset's ext, with its ';'
// alternatives, case_sensitive_extensions and missing_component_behavior.
// It does so when the map is opened. So one map serves any ext, as DALI's
// reader does from one set of shards. Unlike DALI, Select refuses an ext
// entry that no extension of the map fills (ErrNoMatch). The error names
// the map's extensions. View.Skipped counts the samples that skip leaves
// out.
//
// Scale. TestScale measured a map of 1 M samples with 1.9 components each
// in 100 shards, on the 2-core development VM (NVFEED_WDS_SAMPLES=1000000):
//
//   - The map is 75.5 bytes a sample: 24 per sample record, 24 per
//     component, and the key.
//   - Open copies it into the process's own read-only memory, checks every
//     record and indexes the samples by pattern (index.go). That took
//     100 ms, 72 MiB for the copy and 5.3 MiB for the index. The index
//     holds 4 bytes a sample, and each pattern's largest rooms. At 100 M
//     samples that is about 10 s, 7.6 GB and 400 MB.
//   - A sample's lookup reads its records in place without allocating.
//   - Select judges each pattern once and reads no record: 6 µs with
//     empty. With skip leaving samples out, it fills one bit per sample
//     from the index: 1.1 ms and 129 KiB at 1 M samples.
//   - Building reads each member's header: 48 500 samples/s of two members
//     from the page cache (mkbmap over 20 shards of 5000). That is about
//     35 minutes for 100 M samples, one shard at a time.
package wds
