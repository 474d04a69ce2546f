// SPDX-License-Identifier: Apache-2.0

//go:build race

package loader

// raceOn reports the race detector: timings under it mean nothing.
const raceOn = true
