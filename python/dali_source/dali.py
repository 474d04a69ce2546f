# SPDX-License-Identifier: Apache-2.0
"""``nvfeed.dali`` under the client's former name: ``import
dali_source.dali`` gives the same module object."""

from __future__ import annotations

import sys

import nvfeed.dali

sys.modules[__name__] = nvfeed.dali
