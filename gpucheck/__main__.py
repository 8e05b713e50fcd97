"""`python -m gpucheck` and `torchrun -m gpucheck` (run on every rank)."""

import sys

from gpucheck.cli import main

if __name__ == "__main__":
    sys.exit(main())
