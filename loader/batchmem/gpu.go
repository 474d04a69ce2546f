package batchmem

import (
	"fmt"

	"github.com/nvfeed/nvfeed/internal/cuda"
)

// openGPU makes GPU memory. Without a driver it fails with ErrNoCUDA;
// with one, this build has no device-memory slots yet and says so.
func openGPU(int, int64, Options) (Memory, error) {
	if _, err := cuda.DriverVersion(); err != nil {
		return nil, fmt.Errorf("batchmem: memory kind gpu: %w: %w", ErrNoCUDA, err)
	}
	return nil, fmt.Errorf("batchmem: %w: memory kind gpu is not in this build (batches land in pinned, CUDA-registered host memory; see loaderd check)", ErrUnsupported)
}
