// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
)

// summarise computes d's content, once, when its map is loaded.
// A webdataset's content is its samples', not its tars'.
func (d *dataset) summarise(log *slog.Logger) {
	if d.wds == nil {
		c := d.m.Content()
		d.content = &c
		return
	}
	c, err := d.wds.Content()
	if err != nil {
		d.content = nil
		log.Warn("session: webdataset content not summarised: its ranks cannot name a difference", "dataset", d.name, "err", err)
		return
	}
	d.content = &c
}

// contentFor returns d's content as caller c may see it.
// It names each chunk's first sample only if c may read them all.
// nil: the dataset has no content summary.
func (d *dataset) contentFor(ctx context.Context, c Caller) *bmap.Content {
	if d.content == nil {
		return nil
	}
	out := *d.content
	k := out.Len()
	idx := make([]int32, 0, k)
	for i := range k {
		at := i * out.Samples / k
		if d.wds != nil {
			s, err := d.wds.Sample(at)
			if err != nil {
				return out.Unnamed()
			}
			at = s.Shard
		}
		idx = append(idx, int32(at))
	}
	if authorizeFiles(ctx, d.name, d.m, idx, d.guard, c) != nil {
		return out.Unnamed()
	}
	return &out
}

// checkContent refuses a resume from st on a copy of d that differs.
// The error wraps ErrDisagree and names the first chunk that differs.
// A state without content, or a dataset without one, is not checked.
func (d *dataset) checkContent(ctx context.Context, c Caller, st *loader.State) error {
	if st == nil || st.Content == nil || d.content == nil || st.Content.Digest == d.content.Digest {
		return nil
	}
	diff := d.contentFor(ctx, c).Diff(*st.Content, "the state's")
	return fmt.Errorf("%w: dataset %s on this node is not the copy the state was taken on: %s. Resume on a node whose copy is the same (mkbmap its files and loaderd reload), or start afresh",
		ErrDisagree, d.name, diff)
}
