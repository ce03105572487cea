"""`ray job submit` entry point: ask a run on this cluster to append a block.

    raylocal/submit grow --run NAME --kind layer --width 128

Takes the arguments of `growpipe grow` (see --help).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the uploaded working_dir's package

from growpipe.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["grow", *sys.argv[1:]], exits=True))
