#!/usr/bin/env bash
# Runs a command for a ctest test that matches the command's output (PASS_REGULAR_EXPRESSION), and checks
# its exit status too: with PASS_REGULAR_EXPRESSION set, ctest ignores the status, so a run that prints the
# expected line and then crashes (or fails at teardown) would pass. Usage:
#   exit_status.sh EXPECTED COMMAND [ARG...]
# A status other than EXPECTED prints "strata-test: exit status S, expected EXPECTED", which the test's
# FAIL_REGULAR_EXPRESSION (strata_exit_failure in tests/CMakeLists.txt) turns into a failure; 77 (a
# skip, with SKIP_RETURN_CODE 77) passes through.
expected=$1
shift
"$@"
status=$?
if [[ $status -eq 77 && $expected -ne 77 ]]; then exit 77; fi
if [[ $status -ne $expected ]]; then
  echo "strata-test: exit status $status, expected $expected"
  exit 1
fi
exit 0
