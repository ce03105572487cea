"""`ray job submit` entry point: serve a net with Ray Serve on the cluster the job runs on (POST /predict).

    raylocal/submit serve --run NAME --follow --address auto
    ray job submit --working-dir . --runtime-env jobs/runtime_env.yaml -- python jobs/serve.py --run NAME ...

Takes the arguments of `growpipe serve` (see --help). With --follow the job's driver is the follower: it
deploys each new checkpoint of the run, so the job keeps running; `ray job stop` ends it and deletes the
application (the cluster stays).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the uploaded working_dir's package

from growpipe.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]], exits=True))
