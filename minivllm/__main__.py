import sys

from minivllm.entrypoints.cli import main

sys.exit(main())
