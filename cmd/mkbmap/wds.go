// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/internal/cli"
)

// wdsArgs are mapCmd's flags that --reader webdataset reads.
type wdsArgs struct {
	root, out, fileList, indexPaths, format string
	workers                                 int
	requireExtents                          bool
	files                                   []string
}

// wdsCmd maps tar shards for fn.readers.webdataset.
func wdsCmd(ctx context.Context, fs *flag.FlagSet, set map[string]bool, a wdsArgs, stderr io.Writer) error {
	for _, f := range []string{"filter", "case-sensitive-filter", "file-filter", "labels", "verify"} {
		if set[f] {
			return cli.UsageErr(fs, "--%s does not apply to --reader webdataset", f)
		}
	}
	switch {
	case a.format != "bmap":
		return cli.UsageErr(fs, "--reader webdataset writes a version 3 .bmap only (--format bmap)")
	case len(a.files) > 0:
		return cli.UsageErr(fs, "--reader webdataset: list the tars in --file-list, not as arguments")
	case a.root == "" && a.fileList == "":
		return cli.UsageErr(fs, "--mountpoint is required")
	}
	if a.root == "" {
		a.root = filepath.Dir(a.fileList)
	}
	if st, err := os.Stat(a.root); err != nil || !st.IsDir() {
		return cli.UsageErr(fs, "--mountpoint %s: not a directory (%v)", a.root, err)
	}
	o := wds.BuildOptions{Workers: a.workers, RequireExtents: a.requireExtents}
	var err error
	if a.fileList != "" {
		if o.Paths, err = readLines(a.fileList); err != nil {
			return err
		}
	}
	if a.indexPaths != "" {
		if o.IndexPaths, err = readLines(a.indexPaths); err != nil {
			return err
		}
	}
	if a.out == "" {
		abs, _ := filepath.Abs(a.root)
		a.out = filepath.Base(abs) + ".bmap"
	}
	t0 := time.Now()
	st, err := wds.Build(ctx, a.root, a.out, o)
	if err != nil {
		return err
	}
	el := time.Since(t0)
	fmt.Fprintf(stderr, "mkbmap: wrote %s (bmap version %d, fn.readers.webdataset): %d shards, %d samples, %d components, %d bytes; %.0f samples/s\n",
		a.out, wds.Version, st.Shards, st.Samples, st.Components, st.Bytes, float64(st.Samples)/el.Seconds())
	return nil
}

// readLines reads the non-blank lines of a list file, trimmed.
func readLines(name string) ([]string, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

const samplesUsage = `usage: mkbmap samples --ext EXT[,EXT...] [--missing empty|skip|error] [--case-sensitive=false] [--limit N] MAPFILE

Lists a webdataset map's samples as fn.readers.webdataset(ext=[EXT, ...])
forms them, one JSON object a line: the sample's shard, key and, per
output, the component's [offset, size] in the tar, or null where the
output is empty. Each EXT may hold ';'-separated alternatives.

flags:`

// samplesCmd prints a webdataset map's samples through an ext selection.
func samplesCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mkbmap samples", flag.ContinueOnError)
	ext := fs.String("ext", "", "the outputs' extensions, comma-separated (DALI's ext list); required")
	missing := fs.String("missing", "empty", "missing_component_behavior: empty, skip or error")
	cs := fs.Bool("case-sensitive", true, "case_sensitive_extensions")
	limit := fs.Int("limit", -1, "print at most this many samples (-1: all)")
	if err := cli.Parse(fs, args, stdout, stderr, samplesUsage); err != nil {
		return err
	}
	if fs.NArg() != 1 || *ext == "" {
		return cli.UsageErr(fs, "give --ext and one map file")
	}
	mb, err := wds.ParseMissing(*missing)
	if err != nil {
		return cli.UsageErr(fs, "--missing: %v", err)
	}
	m, err := wds.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	defer m.Close()
	v, err := m.Select(wds.Options{Ext: strings.Split(*ext, ","), CaseSensitive: *cs, Missing: mb})
	if err != nil {
		return err
	}
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	comps := make([]int, v.Outputs())
	for i := range v.Len() {
		if *limit >= 0 && i >= *limit {
			break
		}
		s, err := v.Sample(i, comps)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, `{"shard":%q,"key":%q,"outputs":[`, m.Shards.Samples[s.Shard].Path, s.Key)
		for k, j := range comps {
			if k > 0 {
				w.WriteString(",")
			}
			if j < 0 {
				w.WriteString("null")
				continue
			}
			c, err := m.Component(s, j)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, `[%d,%d,%q]`, c.Offset, c.Size, c.Name(m, s.Key))
		}
		w.WriteString("]}\n")
	}
	return nil
}
