// SPDX-License-Identifier: Apache-2.0

// Package counts is the built-in backends' counters under the names the
// daemon exports (nvfeed_backend{counter=NAME}) and loaderd bench prints:
// every built-in backend reports all of them, zero where it has none, so
// the series and the JSON keep their names whichever backend runs.
package counts

import "github.com/nvfeed/nvfeed/loader/backend"

// Counts are the built-in backends' counters.
type Counts struct {
	Samples       int64 // samples read, failed ones included
	RawSamples    int64 // read from the device
	FSOnlySamples int64 // read through the filesystem because the map says so
	StaleSamples  int64 // found changed since mapping
	Errors        int64 // samples that failed
	Requests      int64 // device read requests issued
	RawBytes      int64 // bytes read from the device
	BouncedBytes  int64 // of them, read into bounce memory and copied (not in place)
	PeakInFlight  int64 // most requests in flight at once
	CacheHits     int64 // bam: blocks served from the cache
	CacheMisses   int64
	// cufile: what cuFile's own statistics say ran on this GPU (process
	// wide): peer-to-peer or nvidia-fs reads, and its POSIX fallback's.
	CuFileP2PReads, CuFilePOSIXReads int64
}

// Counters lists them by name, in a fixed order.
func (c Counts) Counters() []backend.Counter {
	return []backend.Counter{
		{Name: "samples", Value: c.Samples}, {Name: "raw_samples", Value: c.RawSamples}, {Name: "fs_only_samples", Value: c.FSOnlySamples},
		{Name: "stale_samples", Value: c.StaleSamples}, {Name: "errors", Value: c.Errors}, {Name: "requests", Value: c.Requests},
		{Name: "raw_bytes", Value: c.RawBytes}, {Name: "bounced_bytes", Value: c.BouncedBytes},
		{Name: "peak_in_flight", Value: c.PeakInFlight}, {Name: "cache_hits", Value: c.CacheHits}, {Name: "cache_misses", Value: c.CacheMisses},
		{Name: "cufile_p2p_reads", Value: c.CuFileP2PReads}, {Name: "cufile_posix_reads", Value: c.CuFilePOSIXReads},
	}
}
