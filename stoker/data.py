"""Where the project's data sets live: the data_dir setting (STOKER_DATA_DIR), else data/ in the
checkout."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stoker.settings import StokerSettings

# The checkout's own data/ folder: the repository ships what it uses (CLINC150, the sample log).
REPO_DATA_DIR = Path(__file__).resolve().parents[1] / "data"


def data_dir(settings: StokerSettings | None = None) -> Path:
    """The settings' data folder (without settings: the environment's, read now), else the
    checkout's. A bad STOKER_* variable is the one-line UsageError every verb gives."""
    from stoker.settings import StokerSettings  # here: the settings import most of stoker

    s = settings if settings is not None else StokerSettings()
    return Path(s.data_dir) if s.data_dir else REPO_DATA_DIR


def clinc_path(settings: StokerSettings | None = None) -> Path:
    """CLINC150 (CC BY 3.0, https://github.com/clinc/oos-eval): real utterances, 150 intents
    and out-of-scope, in the data folder."""
    return data_dir(settings) / "clinc150" / "data_full.json"


# The sample request log (data/sample/README.md): what the demos and the benchmarks replay.
SAMPLE_LOG = REPO_DATA_DIR / "sample" / "requests-2w.parquet"
