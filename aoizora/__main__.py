import sys

from aoizora.cli import main

sys.exit(main())
