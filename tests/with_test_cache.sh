#!/usr/bin/env bash
# Runs a command (a test target's pytest) with one persistent compilation cache for its
# whole run, MULTIPOD_TEST_CACHE (tests/conftest.py): a program that several tests, both
# xdist workers or the tests' training subprocesses compile is compiled once. A cache
# already named in the environment (`.ci/run` names one for all its targets) is used as
# it is; otherwise a fresh one is made for the command and removed after it.
set -u
if [ -n "${MULTIPOD_TEST_CACHE:-}" ]; then
  exec "$@"
fi
cache=$(mktemp -d /tmp/multipod-test-xla.XXXXXX)
MULTIPOD_TEST_CACHE=$cache "$@"
rc=$?
rm -rf "$cache"
exit $rc
