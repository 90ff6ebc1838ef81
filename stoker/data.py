"""Where the project's data sets live: STOKER_DATA_DIR, else data/ in the checkout."""

from __future__ import annotations

import os
from pathlib import Path

# The checkout's own data/ folder: the repository ships what it uses (CLINC150, the sample log).
REPO_DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DATA_DIR = Path(os.environ.get("STOKER_DATA_DIR") or REPO_DATA_DIR)
# CLINC150 (CC BY 3.0, https://github.com/clinc/oos-eval): real utterances, 150 intents + oos.
CLINC = DATA_DIR / "clinc150" / "data_full.json"
