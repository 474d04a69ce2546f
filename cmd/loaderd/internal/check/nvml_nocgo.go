// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

package check

import "errors"

// nvmlGPUs: NVML's Go binding needs cgo, and this build has none.
func nvmlGPUs() ([]GPU, string, error) {
	return nil, "", errors.New("this loaderd was built without cgo: NVML (go-nvml) is unavailable")
}
