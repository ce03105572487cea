"""`ray job submit` entry point: train (and grow) one run on the cluster the job runs on.

    raylocal/submit train --config configs/demo.yaml
    ray job submit --working-dir . --runtime-env jobs/runtime_env.yaml -- python jobs/train.py --config ...

Takes the arguments of `growpipe train` (see --help); the job's driver joins the cluster ($RAY_ADDRESS).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the uploaded working_dir's package

from growpipe.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]], exits=True))
