// SPDX-License-Identifier: Apache-2.0

// Command mkbmap maps every sample of a DALI dataset to its physical
// extents and writes a block map.
//
//	mkbmap [--reader file|numpy] --mountpoint ROOT [-o FILE] [--format bmap|json|xnvme-json] [--workers N] [--verify] [--require-extents]
//	mkbmap [--reader file|numpy] --file-list LIST [--mountpoint ROOT] ...
//	mkbmap [--reader file|numpy] --mountpoint ROOT [--labels L,...] ... FILE...
//	mkbmap --reader webdataset (--mountpoint ROOT | --file-list TARS) [--index-paths LIST] [-o FILE]
//	mkbmap samples --ext EXT[,EXT...] [--missing empty|skip|error] MAPFILE
//	mkbmap inspect [--format json|bmap|xnvme-json] [-o FILE] [--mountpoint ROOT] MAPFILE
//
// The samples are those DALI's reader lists: a folder layout, .npy files, a file list or arguments.
// A filesystem without device extents gets a filesystem-only map; --require-extents refuses it.
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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
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
	} else if len(args) > 0 && args[0] == "samples" {
		err = samplesCmd(args[1:], stdout, stderr)
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

const mapUsage = `usage: mkbmap [--reader file|numpy] --mountpoint ROOT [-o FILE] [--format bmap|json|xnvme-json] [--workers N] [--verify] [--require-extents]
       mkbmap --reader webdataset (--mountpoint ROOT | --file-list TARS) [--index-paths LIST] [-o FILE] ...
       mkbmap [--reader file|numpy] --file-list LIST [--mountpoint ROOT] [-o FILE] ...
       mkbmap [--reader file|numpy] --mountpoint ROOT [--labels L,...] [-o FILE] ... FILE...

Maps every sample of a DALI dataset to its extents on the block device, in
the order DALI's reader lists them:
  --reader file (default): fn.readers.file, one folder per class
      (ROOT/CLASS/FILE), or a file list of "path label" lines (--file-list),
      or the files given (labels from --labels, else 0, 1, 2, ...);
  --reader numpy: fn.readers.numpy, the .npy files directly in ROOT and in
      its immediate subdirectories matching --file-filter (default
      *.npy), or a list of paths (--file-list), or the files given; each
      sample is the array's data (not the .npy header), with its dtype and
      shape: one dtype and number of dimensions per dataset, as DALI's
      batches need;
  --reader webdataset: fn.readers.webdataset, the .tar shards directly in
      ROOT (sorted bytewise) or listed one per line (--file-list), with
      DALI's index_paths (--index-paths); every member is mapped, the
      extensions (ext) are chosen when the map is opened. A version 3 map
      (.bmap only).
List and file paths are relative to ROOT (by default the list's folder).
On a filesystem without device extents (tmpfs, NFS, overlay, btrfs, ...)
every sample is filesystem-only: the map serves the file backend.
(mkbmap inspect --help: summarize, convert or verify a map.)

flags:`

func mapCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mkbmap", flag.ContinueOnError)
	root := fs.String("mountpoint", "", "dataset root (DALI's file_root): required, except with --file-list (default: the list's folder)")
	out := fs.String("o", "", "output file (default: <root name>.bmap, or .json, in the current directory)")
	format := fs.String("format", "bmap", "output format: bmap, json or xnvme-json")
	workers := fs.Int("workers", 0, "parallel FIEMAP workers (default 4 per CPU)")
	verify := fs.Bool("verify", false, "read every raw sample from the device with O_DIRECT and compare with the file")
	readerName := fs.String("reader", "file", "the DALI reader: file (fn.readers.file), numpy (fn.readers.numpy) or webdataset (fn.readers.webdataset)")
	indexPaths := fs.String("index-paths", "", "--reader webdataset: a file listing DALI's index_paths (wds2idx indexes), one per line, one per shard")
	filter := fs.String("filter", "", "--reader file: comma-separated file name globs replacing DALI's default filters")
	caseSens := fs.Bool("case-sensitive-filter", false, "--reader file: match filters case-sensitively (DALI's case_sensitive_filter)")
	fileFilter := fs.String("file-filter", "", "--reader numpy: the file name glob (DALI's file_filter; default *.npy)")
	fileList := fs.String("file-list", "", "a file list (DALI's file_list): \"path label\" lines (--reader file) or paths (--reader numpy)")
	labels := fs.String("labels", "", "--reader file with FILE arguments: comma-separated labels, one per file (DALI's labels; default 0, 1, 2, ...)")
	requireExtents := fs.Bool("require-extents", false, "refuse a filesystem without device extents (tmpfs, NFS, overlay, btrfs, ...) instead of writing a filesystem-only map")
	if err := cli.Parse(fs, args, stdout, stderr, mapUsage); err != nil {
		return err
	}
	files, err := interleaved(fs, args)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *readerName == "webdataset" {
		return wdsCmd(ctx, fs, set, wdsArgs{root: *root, out: *out, fileList: *fileList, indexPaths: *indexPaths, workers: *workers, requireExtents: *requireExtents, format: *format, files: files}, stderr)
	}
	if set["index-paths"] {
		return cli.UsageErr(fs, "--index-paths is fn.readers.webdataset's (--reader webdataset)")
	}
	reader, err := bmap.ParseReader(*readerName)
	if err != nil {
		return cli.UsageErr(fs, "--reader: %v", err)
	}
	listed := *fileList != "" || len(files) > 0
	switch {
	case *fileList != "" && len(files) > 0:
		return cli.UsageErr(fs, "give the files as arguments or in --file-list, not both (as DALI's files and file_list)")
	case reader == bmap.ReaderNumpy && (set["filter"] || set["case-sensitive-filter"]):
		return cli.UsageErr(fs, "--filter and --case-sensitive-filter are fn.readers.file's: fn.readers.numpy has one --file-filter")
	case reader == bmap.ReaderFile && set["file-filter"]:
		return cli.UsageErr(fs, "--file-filter is fn.readers.numpy's (--reader numpy): fn.readers.file's are --filter")
	case listed && (set["filter"] || set["case-sensitive-filter"] || set["file-filter"]):
		return cli.UsageErr(fs, "filters choose files under --mountpoint: they do not apply to listed files (DALI ignores them there)")
	case set["labels"] && (len(files) == 0 || reader != bmap.ReaderFile):
		return cli.UsageErr(fs, "--labels goes with files given as arguments to --reader file (as DALI's labels with files)")
	case len(files) > 0 && *root == "":
		return cli.UsageErr(fs, "files given as arguments: give the dataset root they are relative to with --mountpoint")
	case *root == "" && *fileList == "":
		return cli.UsageErr(fs, "--mountpoint is required")
	}
	if *root == "" {
		*root = filepath.Dir(*fileList) // DALI: file_root defaults to the list's folder
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
	if f == bmap.FormatXNVMe && reader != bmap.ReaderFile {
		return cli.UsageErr(fs, "--format xnvme-json holds whole files: the xNVMe example would serve the .npy headers")
	}
	opts := bmap.BuildOptions{Workers: *workers, RequireExtents: *requireExtents, Reader: reader}
	opts.CaseSensitive = *caseSens
	opts.FileFilter = *fileFilter
	if *filter != "" {
		opts.Filters = strings.Split(*filter, ",")
	}
	switch {
	case *fileList != "":
		if opts.Files, err = readList(*fileList, reader); err != nil {
			return err
		}
	case len(files) > 0:
		if opts.Files, err = argFiles(fs, files, *labels, set["labels"], reader); err != nil {
			return err
		}
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
	if err == nil {
		err = m.CheckTensors() // one dtype and rank, as DALI's batches need
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
	fmt.Fprintf(stderr, "mkbmap: wrote %s (%s, %s): %s; %.0f samples/s\n", *out, f, describe(m), st, float64(st.Samples)/elapsed.Seconds())
	if t := tensorSummary(m); t != "" {
		fmt.Fprintf(stderr, "mkbmap: tensors: %s\n", t)
	}
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

// interleaved returns the arguments that are not flags, parsing the flags
// among and after them (fs has parsed args up to the first one); all
// after a "--" are arguments.
func interleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var out []string
	for fs.NArg() > 0 {
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(out, rest...), nil
		}
		out = append(out, rest[0])
		args = rest[1:]
		if err := fs.Parse(args); err != nil { // fs.Usage printed the usage line
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", cli.ErrUsage, err)
		}
	}
	return out, nil
}

// readList reads a file list as the reader's DALI reader does.
func readList(name string, reader bmap.Reader) ([]bmap.Entry, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	parse := bmap.ParseFileList
	if reader == bmap.ReaderNumpy {
		parse = bmap.ParseNumpyFileList
	}
	entries, err := parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return entries, nil
}

// argFiles gives the files named as arguments their labels: --labels, or
// their index (DALI's labels for files given without any); none (0) for
// fn.readers.numpy.
func argFiles(fs *flag.FlagSet, files []string, labels string, haveLabels bool, reader bmap.Reader) ([]bmap.Entry, error) {
	entries := make([]bmap.Entry, len(files))
	var ls []string
	if haveLabels {
		ls = strings.Split(labels, ",")
		if len(ls) != len(files) {
			return nil, cli.UsageErr(fs, "--labels: %d labels for %d files", len(ls), len(files))
		}
	}
	for i, p := range files {
		entries[i] = bmap.Entry{Path: p}
		if reader == bmap.ReaderFile {
			entries[i].Label = int32(i)
		}
		if haveLabels {
			l, err := strconv.ParseInt(strings.TrimSpace(ls[i]), 10, 32)
			if err != nil {
				return nil, cli.UsageErr(fs, "--labels: label %d %q: not a 32-bit integer", i+1, ls[i])
			}
			entries[i].Label = int32(l)
		}
	}
	return entries, nil
}

// describe names the map's kind: "fn.readers.file, folders".
func describe(m *bmap.Map) string {
	how := "folders"
	switch {
	case m.Listed:
		how = "listed"
	case m.Reader == bmap.ReaderNumpy:
		how = "discovered"
	}
	return fmt.Sprintf("fn.readers.%s, %s", m.Reader, how)
}

// tensorSummary describes a numpy map's arrays by type, shape and count.
func tensorSummary(m *bmap.Map) string {
	if m.Reader != bmap.ReaderNumpy || len(m.Samples) == 0 {
		return ""
	}
	type key struct {
		dt    string
		shape string
	}
	kinds := map[key]int{}
	dtypes := map[string]bool{}
	ranks := map[int]bool{}
	for i := range m.Samples {
		t := m.Samples[i].Tensor
		kinds[key{t.DType.String(), npy.FormatShape(t.Shape)}]++
		dtypes[t.DType.String()] = true
		ranks[len(t.Shape)] = true
	}
	if len(kinds) == 1 {
		for k, n := range kinds {
			return fmt.Sprintf("%d %s %s", n, k.dt, k.shape)
		}
	}
	if len(dtypes) == 1 && len(ranks) == 1 {
		return fmt.Sprintf("%d %s arrays of %d shapes, %d-d (ragged)", len(m.Samples), m.Samples[0].Tensor.DType,
			len(kinds), len(m.Samples[0].Tensor.Shape))
	}
	names := make([]string, 0, len(dtypes))
	for d := range dtypes {
		names = append(names, d)
	}
	slices.Sort(names)
	return fmt.Sprintf("%d arrays of %d (dtype, shape) kinds, dtypes %s (ragged: no dense batch)", len(m.Samples), len(kinds), strings.Join(names, ", "))
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
		fmt.Fprintf(stdout, "map:     %s (version %d)\nroot:    %s\ndevice:  %s (%d:%d) on %s at +%d, %d-byte blocks, %s %s\nreader:  %s\nclasses: %d\n%s\n",
			path, m.Version, m.Root, d.Path, d.Major, d.Minor, d.Disk, d.PartitionStart, d.LogicalBlockSize, d.FSType, d.FSUUID,
			describe(m), len(m.Classes), m.Stats())
		if t := tensorSummary(m); t != "" {
			fmt.Fprintf(stdout, "tensors: %s\n", t)
		}
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
