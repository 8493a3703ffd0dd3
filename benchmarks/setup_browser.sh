#!/usr/bin/env bash
# Debian's Chromium and ChromeDriver, for real MiniWoB++ (the same step as `make browser`).
set -euo pipefail
cd "$(dirname "$0")/.."
make browser
