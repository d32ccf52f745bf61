#!/bin/sh
# slowest_tests.sh JUNIT_XML [N]: the N (default 10) slowest tests of a ctest run, with their wall
# seconds, from the JUnit file `make test` has ctest write (BUILD/ctest-junit.xml). `make test` and
# CI print it after every run, so growth shows at once.
xml="${1:-build/ctest-junit.xml}"
n="${2:-10}"
[ -f "$xml" ] || { echo "slowest_tests: no $xml"; exit 0; }
echo "# the $n slowest tests of this run (wall seconds; ctest -j runs several at once):"
grep -o '<testcase [^>]*>' "$xml" |
  sed -n 's/.*name="\([^"]*\)".*time="\([0-9.eE+-]*\)".*status="\([^"]*\)".*/\2 \1 \3/p' |
  sort -rn | head -n "$n" | awk '{ printf "%8.1f  %s%s\n", $1, $2, ($3 == "run" ? "" : "  (" $3 ")") }'
