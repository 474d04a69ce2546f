// SPDX-License-Identifier: Apache-2.0

// Command mkbmap maps every sample of a DALI fn.readers.file dataset to its
// physical extents and writes a block map.
//
//	mkbmap --mountpoint ROOT [-o FILE] [--format bmap|json|xnvme-json] [--workers N] [--verify] [--require-extents]
//	mkbmap inspect [--format json|bmap|xnvme-json] [-o FILE] [--mountpoint ROOT] MAPFILE
//
// ROOT holds one folder per class, as DALI's fn.readers.file wants
// (ROOT/CLASS/FILE). On a filesystem without device extents (tmpfs, NFS,
// overlay, btrfs, …) the map's samples are all filesystem-only, for the
// file backend; --require-extents refuses such a filesystem instead.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// version is this release, set at link time from python/nvfeed/VERSION
// (make build, make wheel): -ldflags "-X main.version=...".
var version = "dev"

// isTerminal reports whether w is a terminal: progress bars are drawn
// only there. Tests replace it.
var isTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var err error
	if len(args) > 0 && (args[0] == "--version" || args[0] == "version") {
		fmt.Fprintf(stdout, "mkbmap %s\n", version)
		return 0
	}
	if len(args) > 0 && args[0] == "help" {
		args = []string{"--help"}
	}
	if len(args) > 0 && args[0] == "inspect" {
		err = inspect(ctx, args[1:], stdout, stderr)
	} else {
		err = mapCmd(ctx, args, stdout, stderr)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, cli.ErrUsage):
		fmt.Fprintf(stderr, "mkbmap: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "mkbmap: %v\n", err)
	return 1
}

const mapUsage = `usage: mkbmap --mountpoint ROOT [-o FILE] [--format bmap|json|xnvme-json] [--workers N] [--verify] [--require-extents]

Maps every sample of a dataset laid out for DALI's fn.readers.file
(ROOT/CLASS/FILE: one folder per class) to its extents on the block device.
On a filesystem without device extents (tmpfs, NFS, overlay, btrfs, ...)
every sample is filesystem-only: the map serves the file backend.
(mkbmap inspect --help: summarize, convert or verify a map.)

flags:`

func mapCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mkbmap", flag.ContinueOnError)
	root := fs.String("mountpoint", "", "dataset root: one subdirectory per class (required)")
	out := fs.String("o", "", "output file (default: <root name>.bmap, or .json, in the current directory)")
	format := fs.String("format", "bmap", "output format: bmap, json or xnvme-json")
	workers := fs.Int("workers", 0, "parallel FIEMAP workers (default 4 per CPU)")
	verify := fs.Bool("verify", false, "read every raw sample from the device with O_DIRECT and compare with the file")
	filter := fs.String("filter", "", "comma-separated file name globs replacing DALI's default filters")
	caseSens := fs.Bool("case-sensitive-filter", false, "match filters case-sensitively (DALI's case_sensitive_filter)")
	requireExtents := fs.Bool("require-extents", false, "refuse a filesystem without device extents (tmpfs, NFS, overlay, btrfs, ...) instead of writing a filesystem-only map")
	if err := cli.Parse(fs, args, stdout, stderr, mapUsage); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageErr(fs, "unexpected argument %q", fs.Arg(0))
	}
	if *root == "" {
		return cli.UsageErr(fs, "--mountpoint is required")
	}
	if st, err := os.Stat(*root); err != nil || !st.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return cli.UsageErr(fs, "--mountpoint %s: %v", *root, err)
	}
	f, err := bmap.ParseFormat(*format)
	if err != nil {
		return cli.UsageErr(fs, "--format: %v", err)
	}
	opts := bmap.BuildOptions{Workers: *workers, RequireExtents: *requireExtents}
	opts.CaseSensitive = *caseSens
	if *filter != "" {
		opts.Filters = strings.Split(*filter, ",")
	}
	if *out == "" {
		abs, _ := filepath.Abs(*root)
		ext := map[bmap.Format]string{bmap.FormatBinary: ".bmap", bmap.FormatJSON: ".json", bmap.FormatXNVMe: ".xnvme.json"}[f]
		*out = filepath.Base(abs) + ext
	}
	var finish func()
	opts.Progress, finish = progress(stderr, "mapping")
	t0 := time.Now()
	m, err := bmap.Build(ctx, *root, opts)
	finish()
	if err != nil {
		return err
	}
	elapsed := time.Since(t0)
	left, err := bmap.WriteFile(*out, m, f)
	if err != nil {
		return err
	}
	st := m.Stats()
	fmt.Fprintf(stderr, "mkbmap: wrote %s (%s): %s; %.0f samples/s\n", *out, f, st, float64(st.Samples)/elapsed.Seconds())
	if m.FSOnly() {
		fmt.Fprintf(stderr, "mkbmap: notice: %s is on %s, which has no device extents: all %d samples are filesystem-only, "+
			"readable by the file backend only (not gds, bam or cufile); --require-extents refuses such a filesystem\n",
			m.Root, m.Device.FSType, st.Samples)
	}
	if f == bmap.FormatXNVMe {
		fmt.Fprintf(stderr, "mkbmap: xnvme-json holds single-extent raw samples only: %d of %d left out\n", left, st.Samples)
	}
	if *verify {
		return verifyMap(ctx, m, *workers, stderr)
	}
	return nil
}

// progress returns a Progress callback drawing a bar on stderr when it is
// a terminal (nil otherwise), and the function that ends the bar.
func progress(stderr io.Writer, what string) (update func(done, total int), finish func()) {
	if !isTerminal(stderr) {
		return nil, func() {}
	}
	bar := progressbar.NewOptions(-1, progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("samples"),
		progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
	return func(done, total int) {
		bar.ChangeMax(total)
		bar.Set(done)
	}, func() { bar.Finish() }
}

func verifyMap(ctx context.Context, m *bmap.Map, workers int, stderr io.Writer) error {
	if st := m.Stats(); st.FSOnly == st.Samples {
		fmt.Fprintf(stderr, "mkbmap: verify: nothing to read from a device: all %d samples are filesystem-only\n", st.Samples)
		return nil
	}
	update, finish := progress(stderr, "verifying")
	rep, err := bmap.VerifyProgress(ctx, m, workers, update)
	finish()
	if err != nil {
		return err
	}
	for _, d := range rep.Differences {
		fmt.Fprintf(stderr, "mkbmap: verify: %s\n", d)
	}
	if n := len(rep.Differences); n > 0 {
		return fmt.Errorf("verify: %d of %d raw samples differ from their files", n, rep.Checked)
	}
	fmt.Fprintf(stderr, "mkbmap: verify: %d raw samples (%d bytes) equal their files\n", rep.Checked, rep.Bytes)
	return nil
}

func inspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mkbmap inspect", flag.ContinueOnError)
	format := fs.String("format", "", "convert: write the map in this format (bmap, json, xnvme-json) instead of a summary")
	out := fs.String("o", "", "with --format: output file (default stdout; required for bmap)")
	root := fs.String("mountpoint", "", "dataset root, needed to import an xnvme-json map")
	verify := fs.Bool("verify", false, "also read every raw sample from the device and compare with the file")
	if err := cli.Parse(fs, args, stdout, stderr, "usage: mkbmap inspect [--format bmap|json|xnvme-json] [-o FILE] [--mountpoint ROOT] [--verify] MAPFILE\n\nPrints a map's summary, converts it (--format), imports an xnvme-json map (--mountpoint)\nor reads its raw samples from the device and compares them with the files (--verify).\n\nflags:"); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return cli.UsageErr(fs, "inspect takes one map file")
	}
	path := fs.Arg(0)
	m, err := bmap.Load(path)
	if errors.Is(err, bmap.ErrXNVMe) {
		if *root == "" {
			return cli.UsageErr(fs, "%s is an xnvme-json map: give its dataset root with --mountpoint", path)
		}
		b, rerr := os.ReadFile(path)
		if rerr != nil {
			return rerr
		}
		var rep bmap.ImportReport
		m, rep, err = bmap.ImportXNVMe(ctx, b, *root, bmap.BuildOptions{})
		if err == nil {
			fmt.Fprintf(stderr, "mkbmap: %s: %d entries: %d match the filesystem, %d disagree (read through the filesystem), %d name no sample; %d samples not listed were mapped afresh\n",
				path, rep.Entries, rep.Matched, rep.Mismatched, rep.Unknown, rep.Unlisted)
		}
	}
	if err != nil {
		return err
	}
	if *format == "" {
		d := m.Device
		fmt.Fprintf(stdout, "map:     %s (version %d)\nroot:    %s\ndevice:  %s (%d:%d) on %s at +%d, %d-byte blocks, %s %s\nclasses: %d\n%s\n",
			path, m.Version, m.Root, d.Path, d.Major, d.Minor, d.Disk, d.PartitionStart, d.LogicalBlockSize, d.FSType, d.FSUUID,
			len(m.Classes), m.Stats())
	} else {
		f, err := bmap.ParseFormat(*format)
		if err != nil {
			return cli.UsageErr(fs, "--format: %v", err)
		}
		if *out == "" && f == bmap.FormatBinary {
			return cli.UsageErr(fs, "--format bmap is binary: give an output file with -o")
		}
		var left int
		if *out == "" {
			left, err = bmap.Encode(stdout, m, f)
		} else {
			left, err = bmap.WriteFile(*out, m, f)
		}
		if err != nil {
			return err
		}
		if f == bmap.FormatXNVMe {
			fmt.Fprintf(stderr, "mkbmap: xnvme-json holds single-extent raw samples only: %d of %d left out\n", left, len(m.Samples))
		}
	}
	if *verify {
		return verifyMap(ctx, m, 0, stderr)
	}
	return nil
}
