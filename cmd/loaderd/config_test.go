// SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name, in string
		want     []configLine
		err      string
	}{
		{"settings, comments, blanks", "# c\n\nsocket = /run/x.sock\n  dataset=a=/m/a.bmap  \ndataset = b=/m/b.bmap\n",
			[]configLine{{3, "socket", "/run/x.sock"}, {4, "dataset", "a=/m/a.bmap"}, {5, "dataset", "b=/m/b.bmap"}}, ""},
		{"empty value", "socket-group =\n", []configLine{{1, "socket-group", ""}}, ""},
		{"no equals", "socket /run/x.sock\n", nil, "line 1: want KEY = VALUE"},
		{"no key", "= x\n", nil, "line 1"},
		{"dashes", "# x\n--socket = /x\n", nil, "line 2: \"--socket\": write flags without dashes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseConfig([]byte(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.err)
				}
				return
			}
			if err != nil || len(got) != len(tt.want) {
				t.Fatalf("got %v, %v", got, err)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("line %d: %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// TestApplyConfig: the file sets flags; a flag on the command line wins
// over all of the file's lines for it; unknown settings and bad values
// are refused naming the file and line.
func TestApplyConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "loaderd.conf")
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	newFS := func() (*flag.FlagSet, *string, *time.Duration, datasetFlags) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.String("config", "", "")
		sock := fs.String("socket", "", "")
		to := fs.Duration("session-timeout", time.Minute, "")
		ds := datasetFlags{}
		fs.Var(ds, "dataset", "")
		return fs, sock, to, ds
	}
	conf := write("socket = /run/a.sock\nsession-timeout = 5s\ndataset = a=/m/a.bmap\ndataset = b=/m/b.bmap\n")

	fs, sock, to, ds := newFS()
	fs.Parse(nil)
	if err := applyConfig(fs, conf); err != nil {
		t.Fatal(err)
	}
	if *sock != "/run/a.sock" || *to != 5*time.Second || len(ds) != 2 || ds["b"] != "/m/b.bmap" {
		t.Errorf("from the file: socket %q, timeout %v, datasets %v", *sock, *to, ds)
	}

	fs, sock, to, ds = newFS()
	fs.Parse([]string{"--socket", "/run/cli.sock", "--dataset", "c=/m/c.bmap"})
	if err := applyConfig(fs, conf); err != nil {
		t.Fatal(err)
	}
	if *sock != "/run/cli.sock" || *to != 5*time.Second || len(ds) != 1 || ds["c"] != "/m/c.bmap" {
		t.Errorf("command line over file: socket %q, timeout %v, datasets %v", *sock, *to, ds)
	}

	for in, want := range map[string]string{
		"sockett = /x\n":                   `line 1: unknown setting "sockett"`,
		"\nsession-timeout = soon\n":       "line 2: session-timeout",
		"dataset = a\n":                    "line 1: dataset: want NAME=MAPFILE",
		"dataset = a=/x\ndataset = a=/y\n": "line 2: dataset",
	} {
		fs, _, _, _ := newFS()
		fs.Parse(nil)
		if err := applyConfig(fs, write(in)); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "loaderd.conf") {
			t.Errorf("%q: err = %v, want one naming the file and %q", in, err, want)
		}
	}
	if err := applyConfig(flag.NewFlagSet("t", flag.ContinueOnError), filepath.Join(dir, "missing.conf")); err == nil {
		t.Errorf("a missing file: no error")
	}
}

// FuzzParseConfig: any input parses or is refused with a line number;
// never a panic, and every setting has a key.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("socket = /run/x.sock\n# c\ndataset = a=/b\n"))
	f.Add([]byte("=\n\x00=\xff\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		lines, err := parseConfig(b)
		if err != nil {
			if !strings.Contains(err.Error(), "line ") && !strings.Contains(err.Error(), "token too long") {
				t.Fatalf("error without a line: %v", err)
			}
			return
		}
		for _, l := range lines {
			if l.key == "" || l.line < 1 {
				t.Fatalf("setting %+v", l)
			}
		}
	})
}
