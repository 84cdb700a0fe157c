#!/usr/bin/env bash
# The HTML report is tested in a real headless browser: Debian's chromium (playwright drives it;
# no browser download). `make test-system` (so CI) calls this; it installs chromium when it is missing
# and says plainly when it cannot (then that one test is skipped, and says why).
set -uo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo -n"
if command -v apt-get >/dev/null 2>&1 \
    && $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null; then
  exit 0
fi
echo "warning: could not install chromium (Debian's package); the HTML report's browser test" \
     "will be skipped" >&2
exit 0
