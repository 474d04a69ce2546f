// SPDX-License-Identifier: Apache-2.0

package layers

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSPDXHeaders: every source file (Go, C, Python, shell, the build and
// deploy files) names its license, Apache-2.0 as LICENSE says, in an
// SPDX line at its top.
func TestSPDXHeaders(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	const tag = "SPDX-License-Identifier: Apache-2.0"
	if b, err := os.ReadFile(filepath.Join(root, "LICENSE")); err != nil || !strings.Contains(string(b), "Apache License") || !strings.Contains(string(b), "Version 2.0") {
		t.Fatalf("LICENSE is not the Apache License 2.0: %v", err)
	}
	skip := map[string]bool{".git": true, ".venv": true, ".tools": true, ".bench": true, ".demo": true, "bin": true, "build": true, "dist": true, "__pycache__": true}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skip[d.Name()] || strings.HasSuffix(d.Name(), ".egg-info") || d.Name() == "testdata" && !strings.Contains(path, "internal/cuda") {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		switch filepath.Ext(name) {
		case ".go", ".c", ".py", ".sh", ".yaml", ".service", ".toml":
		default:
			if name != "Makefile" && name != "Dockerfile" && name != "run" {
				return nil
			}
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		head := string(b[:min(len(b), 300)])
		if !strings.Contains(head, tag) {
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s: no %q at its top", rel, tag)
		}
		checked++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Errorf("only %d files checked: the walk missed the tree", checked)
	}
}
