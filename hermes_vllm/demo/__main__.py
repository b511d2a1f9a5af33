"""``python -m hermes_vllm.demo`` (``make demo``): the side-by-side run."""

import sys

from hermes_vllm.demo import main

sys.exit(main())
