// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// TestDeviceUUIDFormIs400: a device_uuid that is not a GPU UUID's form
// (or is too long) is refused with 400 naming device_uuid, before any GPU
// is looked for.
func TestDeviceUUIDFormIs400(t *testing.T) {
	f := start(t, time.Minute)
	for _, u := range []string{"GPU-../../x", strings.Repeat("f", loader.MaxDeviceUUID+1)} {
		var e wire.ErrorResponse
		code := f.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}, Memory: batchmem.GPU, DeviceUUID: u}}, &e)
		if code != 400 || !strings.Contains(e.Error, "device_uuid") {
			t.Errorf("device_uuid %q: %d %q, want 400 naming device_uuid", u, code, e.Error)
		}
	}
}
