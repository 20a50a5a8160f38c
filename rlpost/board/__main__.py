"""``python -m rlpost.board --runs outputs/``"""

import sys

from rlpost.board.cli import main

sys.exit(main())
