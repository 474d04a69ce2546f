// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"math"
	"math/big"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/loader"
)

// pyArgs is the Python client's argument checks, with its copies of the
// daemon's bounds.
const pyArgs = "../../../../python/nvfeed/_args.py"

// pyConst is a Python constant's value: a decimal, "1 << n" or
// "(1 << n) - 1" (the forms _args.py writes its bounds in).
var pyConst = regexp.MustCompile(`(?m)^([A-Z_]+) = (?:(\d+)|1 << (\d+)|\(1 << (\d+)\) - 1)\s*$`)

// TestPythonBoundsAreTheDaemons: every bound the Python client checks an
// argument against before asking the daemon (python/nvfeed/_args.py's
// MAX_* and FINGERPRINT_LEN) is the Go constant the daemon checks it
// against, so the two cannot drift; a bound there this test does not
// know fails it too.
func TestPythonBoundsAreTheDaemons(t *testing.T) {
	b, err := os.ReadFile(pyArgs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*big.Int{
		"MAX_BATCH_SIZE":    big.NewInt(loader.MaxBatchSize),
		"MAX_SHARDS":        big.NewInt(loader.MaxSamples),
		"MAX_PREFETCH":      big.NewInt(session.MaxPrefetch),
		"MAX_RELEASE_AFTER": big.NewInt(session.MaxReleaseAfter),
		"MAX_DEVICE":        big.NewInt(session.MaxDevice),
		"MAX_SEED":          new(big.Int).SetUint64(math.MaxUint64), // loader.Sampling.Seed is a uint64
		"MAX_INITIAL_FILL":  big.NewInt(loader.MaxInitialFill),
		"MAX_JOB_ID":        big.NewInt(session.MaxJobID),
		"MAX_FILES":         big.NewInt(session.MaxFiles),
		"FINGERPRINT_LEN":   big.NewInt(bmap.FingerprintLen),
	}
	got := map[string]*big.Int{}
	for _, m := range pyConst.FindAllStringSubmatch(string(b), -1) {
		v := new(big.Int)
		switch {
		case m[2] != "":
			v.SetString(m[2], 10)
		case m[3] != "":
			n, _ := strconv.Atoi(m[3])
			v.Lsh(big.NewInt(1), uint(n))
		default:
			n, _ := strconv.Atoi(m[4])
			v.Sub(v.Lsh(big.NewInt(1), uint(n)), big.NewInt(1))
		}
		got[m[1]] = v
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, _, ok := strings.Cut(line, " = ")
		if ok && (strings.HasPrefix(name, "MAX_") || name == "FINGERPRINT_LEN") && got[name] == nil {
			t.Errorf("%s: %q is not in a form this test reads (a decimal, 1 << n, (1 << n) - 1)", pyArgs, line)
		}
	}
	for name, v := range got {
		if want[name] == nil {
			t.Errorf("%s: %s = %s: no Go constant is known for it (add it to this test)", pyArgs, name, v)
		}
	}
	for name, w := range want {
		if v := got[name]; v == nil {
			t.Errorf("%s has no %s (the daemon's bound is %s)", pyArgs, name, w)
		} else if v.Cmp(w) != 0 {
			t.Errorf("%s: %s = %s, but the daemon's bound is %s", pyArgs, name, v, w)
		}
	}
}
