"""`ray job submit` entry point: run a Ray Tune sweep file on the cluster the job runs on.

    raylocal/submit sweep tune_configs/digits-lr-width.yaml
    ray job submit --working-dir . --runtime-env jobs/runtime_env.yaml -- python jobs/sweep.py tune_configs/...

Takes the arguments of `growpipe sweep` (see --help); the job's driver joins the cluster ($RAY_ADDRESS) and
every trial's stage actors are placed in that trial's own placement group.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the uploaded working_dir's package

from growpipe.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]], exits=True))
