"""Where the project's shared data sets live: STOKER_DATA_DIR, else shared/data beside the checkout."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR = Path(
    os.environ.get("STOKER_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
# CLINC150 (CC BY 3.0, https://github.com/clinc/oos-eval): real utterances, 150 intents + oos.
CLINC = DATA_DIR / "clinc150" / "data_full.json"
