// SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestTrustedIDFlags: --trusted-uid and --trusted-gid take numbers or
// comma lists, repeated, on the command line or as config lines, and
// refuse anything else.
func TestTrustedIDFlags(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "loaderd.conf")
	if err := os.WriteFile(conf, []byte("trusted-uid = 7, 8\ntrusted-uid = 9\ntrusted-gid = 2000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		args       []string
		uids, gids []uint32
		bad        bool
	}{
		{"list and repeat", []string{"--trusted-uid", "1000,1001", "--trusted-uid", "5", "--trusted-gid", "42"}, []uint32{1000, 1001, 5}, []uint32{42}, false},
		{"config file", []string{"--config", conf}, []uint32{7, 8, 9}, []uint32{2000}, false},
		{"command line over the file", []string{"--config", conf, "--trusted-uid", "3"}, []uint32{3}, []uint32{2000}, false},
		{"a name", []string{"--trusted-uid", "alice"}, nil, nil, true},
		{"negative", []string{"--trusted-gid", "-1"}, nil, nil, true},
		{"the invalid id", []string{"--trusted-uid", "4294967295"}, nil, nil, true},
		{"empty item", []string{"--trusted-uid", "1,,2"}, nil, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			config := fs.String("config", "", "")
			var uids, gids idFlags
			fs.Var(&uids, "trusted-uid", "")
			fs.Var(&gids, "trusted-gid", "")
			err := fs.Parse(c.args)
			if err == nil && *config != "" {
				err = applyConfig(fs, *config)
			}
			if (err != nil) != c.bad {
				t.Fatalf("error %v, want bad %v", err, c.bad)
			}
			if !c.bad && (!slices.Equal(uids, c.uids) || !slices.Equal(gids, c.gids)) {
				t.Errorf("uids %v gids %v, want %v %v", uids, gids, c.uids, c.gids)
			}
		})
	}
}
