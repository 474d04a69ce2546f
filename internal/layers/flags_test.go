// SPDX-License-Identifier: Apache-2.0

package layers

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// command is a loaderd or mkbmap command line as the documents write
	// one, up to the end of its code span, table cell or line.
	command  = regexp.MustCompile("(loaderd (serve|status|reload|backends|check|bench)|mkbmap)\\b([^`\\n|]*)")
	longFlag = regexp.MustCompile(`(?:^|[^\w-])--([a-z][a-z0-9-]*)`)
	// helpFlag is a flag as a command's --help lists it.
	helpFlag = regexp.MustCompile(`(?m)(?:^\s+-{1,2}|\[--)([a-z][a-z0-9-]*)`)
)

// TestDocFlagsExist: every flag the documents give loaderd or mkbmap is
// one that the command's --help lists. The commands are built from this
// tree. A flag of the test build (-tags nvfeed_faults) is built with it.
func TestDocFlagsExist(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-tags", "nvfeed_faults", "-o", bin, "./cmd/loaderd", "./cmd/mkbmap")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	known := map[string]map[string]bool{} // subcommand ("mkbmap" for mkbmap) -> its flags
	flagsOf := func(sub string) map[string]bool {
		if known[sub] == nil {
			args := []string{filepath.Join(bin, "loaderd"), sub, "--help"}
			if sub == "mkbmap" {
				args = []string{filepath.Join(bin, "mkbmap"), "--help"}
			}
			out, _ := exec.Command(args[0], args[1:]...).CombinedOutput()
			known[sub] = map[string]bool{"help": true, "version": true}
			for _, m := range helpFlag.FindAllStringSubmatch(string(out), -1) {
				known[sub][m[1]] = true
			}
			if len(known[sub]) < 3 {
				t.Fatalf("%v lists no flags:\n%s", args, out)
			}
		}
		return known[sub]
	}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "python", "README.md"), filepath.Join(root, "ARCHITECTURE.md"))
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range command.FindAllStringSubmatch(line, -1) {
				sub := m[2]
				if sub == "" {
					sub = "mkbmap"
				}
				for _, f := range longFlag.FindAllStringSubmatch(m[3], -1) {
					if !flagsOf(sub)[f[1]] {
						t.Errorf("%s:%d: %s has no flag --%s", rel, i+1, strings.TrimSpace(m[1]), f[1])
					}
					checked++
				}
			}
		}
	}
	if checked < 30 {
		t.Errorf("only %d flags checked: the documents' command lines were missed", checked)
	}
}
