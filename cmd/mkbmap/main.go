// Command mkbmap maps every sample of a DALI fn.readers.file dataset to its
// physical extents and writes a block map.
//
//	mkbmap --mountpoint ROOT [-o FILE] [--format bmap|json|xnvme-json] [--workers N] [--verify]
//	mkbmap inspect [--format json|bmap|xnvme-json] [-o FILE] [--mountpoint ROOT] MAPFILE
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
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// version is this release, set at link time from python/dali_source/VERSION
// (make build, make wheel): -ldflags "-X main.version=...".
var version = "dev"

// errUsage marks errors that should print usage; exit status 2.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var err error
	if len(args) > 0 && (args[0] == "--version" || args[0] == "version") {
		fmt.Fprintf(stdout, "mkbmap %s\n", version)
		return 0
	}
	if len(args) > 0 && args[0] == "inspect" {
		err = inspect(ctx, args[1:], stdout, stderr)
	} else {
		err = mapCmd(ctx, args, stderr)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "mkbmap: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "mkbmap: %v\n", err)
	return 1
}

// parse sets fs's usage text and parses args; a bad flag wraps errUsage.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer, usage string) error {
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

func usageErr(fs *flag.FlagSet, format string, a ...any) error {
	fs.Usage()
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, a...)...)
}

func mapCmd(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("mkbmap", flag.ContinueOnError)
	root := fs.String("mountpoint", "", "dataset root: one subdirectory per class (required)")
	out := fs.String("o", "", "output file (default: <root name>.bmap, or .json, in the current directory)")
	format := fs.String("format", "bmap", "output format: bmap, json or xnvme-json")
	workers := fs.Int("workers", 0, "parallel FIEMAP workers (default 4 per CPU)")
	verify := fs.Bool("verify", false, "read every raw sample from the device with O_DIRECT and compare with the file")
	filter := fs.String("filter", "", "comma-separated file name globs replacing DALI's default filters")
	caseSens := fs.Bool("case-sensitive-filter", false, "match filters case-sensitively (DALI's case_sensitive_filter)")
	if err := parse(fs, args, stderr, "usage: mkbmap --mountpoint ROOT [-o FILE] [--format bmap|json|xnvme-json] [--workers N] [--verify]\n       mkbmap inspect [--format json] MAPFILE"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr(fs, "unexpected argument %q", fs.Arg(0))
	}
	if *root == "" {
		return usageErr(fs, "--mountpoint is required")
	}
	if st, err := os.Stat(*root); err != nil || !st.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return usageErr(fs, "--mountpoint %s: %v", *root, err)
	}
	f, err := bmap.ParseFormat(*format)
	if err != nil {
		return usageErr(fs, "--format: %v", err)
	}
	opts := bmap.BuildOptions{Workers: *workers}
	opts.CaseSensitive = *caseSens
	if *filter != "" {
		opts.Filters = strings.Split(*filter, ",")
	}
	if *out == "" {
		abs, _ := filepath.Abs(*root)
		ext := map[bmap.Format]string{bmap.FormatBinary: ".bmap", bmap.FormatJSON: ".json", bmap.FormatXNVMe: ".xnvme.json"}[f]
		*out = filepath.Base(abs) + ext
	}
	var bar *progressbar.ProgressBar
	if file, ok := stderr.(*os.File); ok && term.IsTerminal(int(file.Fd())) {
		bar = progressbar.NewOptions(-1, progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription("mapping"),
			progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("samples"),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
		opts.Progress = func(done, total int) {
			bar.ChangeMax(total)
			bar.Set(done)
		}
	}
	t0 := time.Now()
	m, err := bmap.Build(ctx, *root, opts)
	if bar != nil {
		bar.Finish()
	}
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
	if f == bmap.FormatXNVMe {
		fmt.Fprintf(stderr, "mkbmap: xnvme-json holds single-extent raw samples only: %d of %d left out\n", left, st.Samples)
	}
	if *verify {
		return verifyMap(ctx, m, *workers, stderr)
	}
	return nil
}

func verifyMap(ctx context.Context, m *bmap.Map, workers int, stderr io.Writer) error {
	rep, err := bmap.Verify(ctx, m, workers)
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
	if err := parse(fs, args, stderr, "usage: mkbmap inspect [--format bmap|json|xnvme-json] [-o FILE] [--mountpoint ROOT] [--verify] MAPFILE"); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageErr(fs, "inspect takes one map file")
	}
	path := fs.Arg(0)
	m, err := bmap.Load(path)
	if errors.Is(err, bmap.ErrXNVMe) {
		if *root == "" {
			return usageErr(fs, "%s is an xnvme-json map: give its dataset root with --mountpoint", path)
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
			return usageErr(fs, "--format: %v", err)
		}
		if *out == "" && f == bmap.FormatBinary {
			return usageErr(fs, "--format bmap is binary: give an output file with -o")
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
