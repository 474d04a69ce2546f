// SPDX-License-Identifier: Apache-2.0

package wds

import (
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"strings"
)

// Missing is fn.readers.webdataset's missing_component_behavior: what a
// sample with fewer matching components than outputs becomes.
type Missing uint8

// Behaviours.
const (
	MissingEmpty Missing = iota // "empty" (and DALI's default ""): its unmatched outputs are empty
	MissingSkip                 // "skip": the sample is left out
	MissingError                // "error": selecting fails (DALI: "Underful sample detected")
)

// ParseMissing reads a missing_component_behavior as DALI does: case
// insensitive, "" meaning empty.
func ParseMissing(s string) (Missing, error) {
	switch strings.ToLower(s) {
	case "", "empty":
		return MissingEmpty, nil
	case "skip":
		return MissingSkip, nil
	case "error":
		return MissingError, nil
	}
	return 0, fmt.Errorf("wds: invalid missing_component_behavior %q: possible values are skip, error, empty", s)
}

// ErrUnderfull is wrapped by Select's error for a sample missing a
// component under MissingError.
var ErrUnderfull = errors.New("underfull sample")

// ErrNoMatch is wrapped by Select's error for an ext entry that no
// extension of the map fills: every sample's output would be empty.
var ErrNoMatch = errors.New("ext matches no member")

// MaxOutputs is the most ext entries a selection takes.
const MaxOutputs = 64

// Options are fn.readers.webdataset's arguments that pick a sample's
// outputs from its components.
type Options struct {
	// Ext: one entry per output, each a ';'-separated list of
	// extensions any of which fills it (DALI's ext).
	Ext []string
	// CaseSensitive is case_sensitive_extensions (DALI's default: true).
	CaseSensitive bool
	// Missing is missing_component_behavior.
	Missing Missing
}

// View is a map seen through Options, as fn.readers.webdataset forms its samples.
// A bitmap keeps the samples it holds. Each output is the first component with its extension.
type View struct {
	m     *Map
	nOut  int
	outs  []uint64 // per map extension: the outputs it fills
	n     int
	keep  []uint64 // nil: every sample; else one bit per map sample
	ranks []uint32 // kept samples before each 512-bit block of keep
	used  [][]int  // per pattern of the map's index: each filled output's component position (nil: none, or not kept)
	// skipped: with MissingSkip, the map's samples left out; lacking,
	// per output, those of them that output would be empty in.
	skipped int
	lacking []int
}

// Select applies o to m at open time, as DALI applies ext, so one map serves any ext.
// It judges each pattern of the map's index once, not each sample.
// An ext entry no extension of the map fills is refused with ErrNoMatch.
func (m *Map) Select(o Options) (*View, error) {
	if len(o.Ext) == 0 || len(o.Ext) > MaxOutputs {
		return nil, fmt.Errorf("wds: %d ext entries: want 1 to %d", len(o.Ext), MaxOutputs)
	}
	ix, err := m.indexed()
	if err != nil {
		return nil, err
	}
	v := &View{m: m, nOut: len(o.Ext), outs: outputsOf(m.exts, o), n: m.nSample, used: make([][]int, len(ix.patterns)), lacking: make([]int, len(o.Ext))}
	if err := v.checkMatched(o); err != nil {
		return nil, err
	}
	kept := make([]bool, len(ix.patterns))
	n, under := 0, -1
	for p, pt := range ix.patterns {
		got, used := v.matchExts(pt.exts)
		if got >= v.nOut || o.Missing == MissingEmpty {
			kept[p], v.used[p] = true, used
			n += pt.count
			continue
		}
		if under < 0 || pt.first < under {
			under = pt.first
		}
		v.skipped += pt.count
		filled := v.filled(pt.exts)
		for out := range v.lacking {
			if filled&(1<<out) == 0 {
				v.lacking[out] += pt.count
			}
		}
	}
	switch {
	case o.Missing == MissingEmpty || under < 0:
		v.skipped, v.lacking = 0, make([]int, v.nOut)
		return v, nil
	case o.Missing == MissingError:
		s, err := m.Sample(under)
		if err != nil {
			return nil, err
		}
		got, _ := v.matchExts(ix.patterns[ix.of[under]].exts)
		return nil, fmt.Errorf("wds: %w at tar file %q, sample %q: %d of %d outputs matched", ErrUnderfull, m.Shards.Samples[s.Shard].Path, s.Key, got, v.nOut)
	}
	v.n = n
	v.keepPatterns(ix, kept)
	return v, nil
}

// checkMatched refuses an ext entry of o that no extension of the map
// fills (ErrNoMatch): the error names the map's extensions, and says an
// extension is given without its dot where the entry has one.
func (v *View) checkMatched(o Options) error {
	var all uint64
	for _, f := range v.outs {
		all |= f
	}
	for out, alts := range o.Ext {
		if all&(1<<out) != 0 {
			continue
		}
		how := "case-sensitively, as DALI's case_sensitive_extensions=True"
		if !o.CaseSensitive {
			how = "case-insensitively"
		}
		hint := ""
		if strings.HasPrefix(alts, ".") || strings.Contains(alts, ";.") {
			hint = fmt.Sprintf("; an extension is named without its dot (%q, not %q)", strings.TrimPrefix(alts, "."), alts)
		}
		return fmt.Errorf("wds: %w: ext[%d] %q fills no output of any sample (matched %s): the tars' extensions are %s%s",
			ErrNoMatch, out, alts, how, listExts(v.m.exts), hint)
	}
	return nil
}

// listExts names exts, sorted, quoted, at most 24 of them.
func listExts(exts []string) string {
	s := append([]string(nil), exts...)
	sort.Strings(s)
	const most = 24
	more := ""
	if len(s) > most {
		more = fmt.Sprintf(" and %d more", len(s)-most)
		s = s[:most]
	}
	q := make([]string, len(s))
	for i, e := range s {
		q[i] = strconv.Quote(e)
	}
	return strings.Join(q, ", ") + more
}

// outputsOf returns, for each of exts, the outputs of o it fills.
func outputsOf(exts []string, o Options) []uint64 {
	byExt := map[string]uint64{}
	for out, alts := range o.Ext {
		// std::getline on ';': no trailing empty field.
		parts := strings.Split(alts, ";")
		if len(parts) > 0 && parts[len(parts)-1] == "" {
			parts = parts[:len(parts)-1]
		}
		for _, e := range parts {
			if !o.CaseSensitive {
				e = strings.ToLower(e)
			}
			byExt[e] |= 1 << out
		}
	}
	outs := make([]uint64, len(exts))
	for i, e := range exts {
		if !o.CaseSensitive {
			e = strings.ToLower(e)
		}
		outs[i] = byExt[e]
	}
	return outs
}

// keepPatterns fills the view's bitmap: the map's samples of the kept
// patterns, and the kept samples before each 512-sample block.
func (v *View) keepPatterns(ix *index, kept []bool) {
	v.keep = make([]uint64, (len(ix.of)+63)/64)
	v.ranks = make([]uint32, (len(ix.of)+511)/512+1)
	n := 0
	for i, p := range ix.of {
		if i%512 == 0 {
			v.ranks[i/512] = uint32(n)
		}
		if kept[p] {
			v.keep[i/64] |= 1 << (i % 64)
			n++
		}
	}
	v.ranks[len(v.ranks)-1] = uint32(n)
}

// matchExts is match for a pattern: how many of its components fill an
// output, and each filled output's component position (a component
// filling two outputs is in two rooms, as a batch lays it out).
func (v *View) matchExts(exts []uint32) (int, []int) {
	var set uint64
	var used []int
	got := 0
	for k, e := range exts {
		fill := v.outs[e] &^ set
		if fill == 0 {
			continue
		}
		got++
		set |= fill
		for f := fill; f != 0; f &= f - 1 {
			used = append(used, k)
		}
	}
	return got, used
}

// filled returns the outputs a pattern's components fill.
func (v *View) filled(exts []uint32) uint64 {
	var set uint64
	for _, e := range exts {
		set |= v.outs[e]
	}
	return set
}

// Skipped returns how many samples MissingSkip left out, and per output how many lack it.
func (v *View) Skipped() (int, []int) { return v.skipped, v.lacking }

// LargestRooms returns the room n samples of the view take at most: the
// sum of its n largest samples' rooms (each output's component's Room),
// or a little more (index.go's largest). It reads no record.
func (v *View) LargestRooms(n int) int64 {
	ix, err := v.m.indexed()
	if err != nil {
		return 0
	}
	return ix.largest(v.used, min(n, MaxRooms))
}

// Bytes is the memory the view holds: its bitmap with skip.
func (v *View) Bytes() int64 {
	return int64(8*len(v.keep) + 4*len(v.ranks) + 24*len(v.used))
}

// match assigns s's components to outputs as DALI does, in tar order.
// It returns how many components fill an output, and each output's component or -1 in comps.
func (v *View) match(s Sample, comps []int) (int, error) {
	for k := range comps {
		comps[k] = -1
	}
	var set uint64
	used := 0
	for j := s.First; j < s.First+s.Count; j++ {
		c, err := v.m.Component(s, j)
		if err != nil {
			return 0, err
		}
		fill := v.outs[c.Ext] &^ set
		if fill == 0 {
			continue
		}
		used++
		set |= fill
		for f := fill; f != 0; f &= f - 1 {
			if k := bits.TrailingZeros64(f); k < len(comps) {
				comps[k] = j
			}
		}
	}
	return used, nil
}

// Len returns the number of samples the view has.
func (v *View) Len() int { return v.n }

// Outputs returns the number of outputs (ext entries).
func (v *View) Outputs() int { return v.nOut }

// Map returns the map the view sees.
func (v *View) Map() *Map { return v.m }

// Index returns the map sample of view sample i.
func (v *View) Index(i int) int {
	if v.keep == nil {
		return i
	}
	// The last block whose rank is <= i holds it.
	b := sort.Search(len(v.ranks)-1, func(b int) bool { return int(v.ranks[b+1]) > i }) // first block ending past i
	left := i - int(v.ranks[b])
	for w := b * 8; w < len(v.keep); w++ {
		c := bits.OnesCount64(v.keep[w])
		if left < c {
			x := v.keep[w]
			for range left {
				x &= x - 1
			}
			return w*64 + bits.TrailingZeros64(x)
		}
		left -= c
	}
	return -1
}

// Sample returns view sample i: its map record and, written into comps
// (len Outputs()), each output's component index, or -1 for an empty
// output. It does not allocate.
func (v *View) Sample(i int, comps []int) (Sample, error) {
	if i < 0 || i >= v.n {
		return Sample{}, fmt.Errorf("wds: sample %d out of range [0,%d)", i, v.n)
	}
	if len(comps) != v.nOut {
		return Sample{}, fmt.Errorf("wds: %d component slots for %d outputs", len(comps), v.nOut)
	}
	s, err := v.m.Sample(v.Index(i))
	if err != nil {
		return Sample{}, err
	}
	_, err = v.match(s, comps)
	return s, err
}

// Shard returns view sample i's shard (an index of Map.Shards), or -1
// when i is out of range or its record is corrupt: what
// fresh.Members.File asks.
func (v *View) Shard(i int) int {
	if i < 0 || i >= v.n {
		return -1
	}
	s, err := v.m.Sample(v.Index(i))
	if err != nil {
		return -1
	}
	return s.Shard
}
