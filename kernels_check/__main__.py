import sys

from kernels_check.cli import main

sys.exit(main())
