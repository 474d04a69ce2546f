# SPDX-License-Identifier: Apache-2.0
"""``nvfeed.torch`` under the client's former name: ``import
dali_source.torch`` gives the module ``nvfeed.torch`` itself (the same
module object, as for the client's other modules), so ``from
dali_source.torch import LoaderDataset`` is the same class."""

from __future__ import annotations

import sys

import nvfeed.torch
from nvfeed.torch import STATE_VERSION as STATE_VERSION
from nvfeed.torch import LoaderDataset as LoaderDataset
from nvfeed.torch import TorchBatch as TorchBatch
from nvfeed.torch import __all__ as __all__
from nvfeed.torch import distributed_shard as distributed_shard

sys.modules[__name__] = nvfeed.torch
