"""``python -m hermes_vllm.demo`` (``make demo``): the side-by-side run.

Guarded so that importing the module (documentation builders, import checkers, ``pkgutil``
walks) starts nothing: the demo trains a model and spawns servers.
"""

import sys

from hermes_vllm.demo import main

if __name__ == "__main__":
    sys.exit(main())
