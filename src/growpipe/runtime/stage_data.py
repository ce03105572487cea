"""What every stage actor that can be stage 0 shares: it reads the dataset itself."""

from __future__ import annotations

from growpipe.config import RunConfig
from growpipe.data import DataBundle, load_data
from growpipe.errors import StageError
from growpipe.nn.specs import InputInfo


class DataReader:
    """Mixin for stage actors: `load_data` on stage 0, then `train_size`. Needs `index` and `cfg`."""

    index: int
    cfg: RunConfig
    bundle: DataBundle | None = None

    def load_data(self) -> tuple[InputInfo, str]:
        """Stage 0 reads the dataset itself; returns what the driver needs to plan the blocks."""
        self.bundle = load_data(self.cfg.data)
        return InputInfo.from_bundle(self.bundle), self.bundle.summary()

    def train_size(self) -> int:
        """Stage 0: training samples per epoch."""
        if self.bundle is None:
            raise StageError(f"stage {self.index} has no data")
        return len(self.bundle.train)
