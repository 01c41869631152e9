#!/usr/bin/env bash
# After pushing: point the Colab badge (notebook and README) and the notebook's HELPERS_URL at the
# repository, so the notebook opened alone from GitHub finds its helpers.py. Then commit and push.
#   bash scripts/publish.sh OWNER/NAME [BRANCH]      (BRANCH defaults to main; run again to change)
set -euo pipefail
exec python3 "$(dirname "$0")/publish.py" "$@"
