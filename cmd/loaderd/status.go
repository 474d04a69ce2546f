// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/serve"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// statusCmd asks the running daemon what it serves and holds and prints
// it: plain text for a person, or the daemon's answer as one JSON object
// (--json: wire.MarshalJSON, what GET /v1/status answers with Accept:
// application/json).
func statusCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loaderd status", flag.ContinueOnError)
	cf := addClientFlags(fs, time.Minute, "")
	asJSON := fs.Bool("json", false, "print the daemon's answer as one JSON object")
	path, err := cf.parse(fs, args, stdout, stderr, statusUsage)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *cf.timeout)
	defer cancel()
	st, err := serve.RequestStatus(ctx, path)
	if err != nil {
		return err
	}
	if *asJSON {
		b, err := wire.MarshalJSON(st)
		if err != nil {
			return err
		}
		_, err = stdout.Write(b)
		return err
	}
	writeStatus(stdout, st)
	return nil
}

// writeStatus prints st for a person: one block per dataset, the
// sessions per user, the budgets.
func writeStatus(w io.Writer, st wire.StatusResponse) {
	n := func(p *int) int {
		if p == nil {
			return 0
		}
		return *p
	}
	fmt.Fprintln(w, "datasets:")
	if len(st.Datasets) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, d := range st.Datasets {
		if !d.Readable {
			fmt.Fprintf(w, "  %s: %s reader, freshness %s (counts only for a user who may read it)\n", d.Name, d.Reader, d.Freshness)
			continue
		}
		// The freshness guard judges files. A webdataset's files are its
		// tars, so its counts are tars, not samples.
		unit := "samples"
		if d.Reader == "webdataset" {
			unit = "tars"
		}
		fmt.Fprintf(w, "  %s: %d samples (%s), %s reader, freshness %s\n", d.Name, n(d.Samples), mib(deref64(d.Bytes)), d.Reader, d.Freshness)
		fmt.Fprintf(w, "    %s: fresh %d  stale %d  writable %d  filesystem-only %d", unit, n(d.Fresh), n(d.Stale), n(d.Writable), n(d.FilesystemOnly))
		if d.Added != nil && *d.Added != 0 {
			fmt.Fprintf(w, "  added since mapping %d", *d.Added)
		}
		fmt.Fprintln(w)
		for _, c := range d.StaleCauses {
			fmt.Fprintf(w, "    read through the filesystem: %d %s %s; fix: %s\n", c.Samples, unit, strings.ReplaceAll(c.Cause, "_", " "), c.Fix)
		}
	}
	fmt.Fprintln(w, "sessions:")
	if len(st.Sessions) == 0 {
		fmt.Fprintln(w, "  none")
	}
	perUser := map[string]int{}
	var users []string
	for _, s := range st.Sessions {
		u := fmt.Sprintf("uid %d", s.UID)
		if s.TCP {
			u = fmt.Sprintf("tcp (uid %d)", s.UID)
		}
		if perUser[u] == 0 {
			users = append(users, u)
		}
		perUser[u]++
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, u := range users {
		fmt.Fprintf(tw, "  %s: %d sessions\n", u, perUser[u])
		for _, s := range st.Sessions {
			if (s.TCP && u != fmt.Sprintf("tcp (uid %d)", s.UID)) || (!s.TCP && u != fmt.Sprintf("uid %d", s.UID)) {
				continue
			}
			mem := s.Memory
			if batchmem.Kind(s.Memory).OnGPU() {
				mem = fmt.Sprintf("gpu %d %s", s.Device, s.GPUPath)
			}
			idle := "streaming"
			if !s.Streaming {
				idle = fmt.Sprintf("idle %.0fs", s.IdleSeconds)
			}
			why := ""
			if s.BackendWhy != "" {
				why = "\t" + s.BackendWhy
			}
			fmt.Fprintf(tw, "    %s\t%s\t%s %s\tsample order %s\topened %s\t%s%s\n", s.Dataset, s.Backend, mem, mib(s.BatchBytes), mib(s.SamplerBytes),
				time.Unix(s.OpenedUnix, 0).Format(time.DateTime), idle, why)
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "budgets:")
	for _, b := range st.Budgets {
		source := ""
		if b.Source != "" {
			source = " (" + b.Source + ")"
		}
		if strings.HasSuffix(b.Name, "memory") {
			fmt.Fprintf(w, "  %-24s %s of %s%s\n", strings.ReplaceAll(b.Name, "_", " "), mib(b.Used), mib(b.Limit), source)
		} else {
			fmt.Fprintf(w, "  %-24s %d of %d%s\n", strings.ReplaceAll(b.Name, "_", " "), b.Used, b.Limit, source)
		}
	}
}

// mib formats a byte count: in MiB, or KiB under one MiB.
func mib(b int64) string {
	if b < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func deref64(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
