// SPDX-License-Identifier: Apache-2.0

// Package cli is what the commands share in parsing their flags. Help goes
// to stdout with every flag. A bad flag is answered with the usage line on
// stderr. One sentinel marks usage errors, which exit with status 2.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// ErrUsage is wrapped by every error that a command line caused.
var ErrUsage = errors.New("usage")

// Parse parses args with fs. On -h/--help it prints usage and every flag
// on stdout and returns flag.ErrHelp; on a bad flag it prints usage's
// first line and a pointer to --help on stderr and returns an error
// wrapping ErrUsage. After it, fs.Usage prints that short form.
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, usage string) error {
	fs.SetOutput(io.Discard) // the error comes back in err, printed once by the caller
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n(%s --help: every flag)\n", FirstLine(usage), fs.Name())
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintln(stdout, usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return err
	case err != nil:
		fs.Usage()
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	return nil
}

// UsageErr prints fs's usage line and returns the formatted error
// wrapping ErrUsage.
func UsageErr(fs *flag.FlagSet, format string, a ...any) error {
	fs.Usage()
	return fmt.Errorf("%w: "+format, append([]any{ErrUsage}, a...)...)
}

// FirstLine returns s up to its first newline.
func FirstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
