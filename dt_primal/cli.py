"""What ``train.py`` and ``evaluate.py`` share: the error exit and report writing."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from dt_primal.errors import UserError
from dt_primal.evaluation import aggregate, markdown


def run_main(main) -> None:
    """Run ``main()``; a UserError becomes a one-paragraph message and exit status 2, a Ctrl-C
    that training did not catch (during the final evaluation, say) a line and status 130."""
    try:
        main()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("\ninterrupted (checkpoints already written are intact)", file=sys.stderr)
        sys.exit(130)


def write_report(results: list[dict], path: Path) -> dict:
    """JSON at ``path`` and the Markdown table beside it (same name, .md); returns the summary."""
    summary = aggregate(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1))
    path.with_suffix(".md").write_text(markdown(summary))
    return summary
