package backend

// Stats are a backend's counters, for reports and metrics. Fields a
// backend does not have stay zero.
type Stats struct {
	Engine        string `json:"engine,omitempty"`    // raw backends: "uring" or "pread"
	Device        string `json:"device,omitempty"`    // raw backends: the block device read
	Freshness     string `json:"freshness,omitempty"` // raw backends: "watch" or "read"
	Samples       int64  `json:"samples"`             // samples read, failed ones included
	RawSamples    int64  `json:"raw_samples"`         // read from the device
	FSOnlySamples int64  `json:"fs_only_samples"`     // read through the filesystem because the map says so
	StaleSamples  int64  `json:"stale_samples"`       // found changed since mapping
	Errors        int64  `json:"errors"`              // samples that failed
	Requests      int64  `json:"requests"`            // device read requests issued
	PeakInFlight  int64  `json:"peak_in_flight"`      // most requests in flight at once
	CacheHits     int64  `json:"cache_hits"`          // bam: blocks served from the cache
	CacheMisses   int64  `json:"cache_misses"`
	// cufile: what cuFile's own statistics say ran on this GPU (process
	// wide): "gds" (peer-to-peer or nvidia-fs reads only), "compat" (its
	// POSIX fallback only), "mixed", or "none" yet; and the read counts.
	CuFileMode       string `json:"cufile_mode,omitempty"`
	CuFileP2PReads   int64  `json:"cufile_p2p_reads"`
	CuFilePOSIXReads int64  `json:"cufile_posix_reads"`
}

// Counter is one named counter of Stats.
type Counter struct {
	Name  string
	Value int64
}

// Counters lists the numeric counters by their JSON names, in a fixed
// order: what metrics export and reports print.
func (s Stats) Counters() []Counter {
	return []Counter{
		{"samples", s.Samples}, {"raw_samples", s.RawSamples}, {"fs_only_samples", s.FSOnlySamples},
		{"stale_samples", s.StaleSamples}, {"errors", s.Errors}, {"requests", s.Requests},
		{"peak_in_flight", s.PeakInFlight}, {"cache_hits", s.CacheHits}, {"cache_misses", s.CacheMisses},
		{"cufile_p2p_reads", s.CuFileP2PReads}, {"cufile_posix_reads", s.CuFilePOSIXReads},
	}
}

// CacheHitRate returns hits/(hits+misses), or 0 without lookups.
func (s Stats) CacheHitRate() float64 {
	if n := s.CacheHits + s.CacheMisses; n > 0 {
		return float64(s.CacheHits) / float64(n)
	}
	return 0
}
