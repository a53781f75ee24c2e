#!/usr/bin/env bash
# Tests tools/install_deps.sh (or the script given as $1) as `make` runs it,
# without installing anything or using the network: a stub apt-get comes first
# in PATH and only records its arguments. The lock wait is the real one: the
# test holds the real dpkg frontend lock with flock(1), which apt and dpkg do
# not see (they take fcntl locks) and which the test always releases. Needs
# root from the second case on; exits 77 (ctest's skip) otherwise.
set -euo pipefail
script=$(realpath "${1:-$(dirname "$0")/../../tools/install_deps.sh}")
lock=/var/lib/dpkg/lock-frontend
missing_pkg=pipeflow-no-such-package
tmp=$(mktemp -d)
holder=""

# release: ends the flock holding $lock (its sleep first, then flock itself).
release() {
  [ -n "$holder" ] || return 0
  local children=()
  read -ra children 2>/dev/null <"/proc/$holder/task/$holder/children" || true
  kill "${children[@]}" "$holder" 2>/dev/null || true
  wait "$holder" 2>/dev/null || true
  holder=""
}
trap 'release; rm -rf "$tmp"' EXIT
# hold: takes $lock with flock(1) in the background and waits until it is held.
hold() {
  flock -o "$lock" sleep 60 </dev/null >/dev/null 2>&1 &
  holder=$!
  for _ in $(seq 50); do flock -n "$lock" true || return 0; sleep 0.1; done
  fail "could not take $lock"
}
fail() {
  echo "FAIL: $*"
  [ ! -s "$tmp/out" ] || tail -n 40 "$tmp/out" | sed 's/^/  | /'
  exit 1
}
# run [VAR=VALUE...] PACKAGE...: the script under test, its output in $tmp/out,
# its exit status in $status and its duration in whole seconds in $took.
run() {
  local start=$SECONDS
  status=0
  env "${@:1:$#-1}" timeout 60 bash "$script" "${@: -1}" >"$tmp/out" 2>&1 || status=$?
  took=$((SECONDS - start))
}
has() { grep -qF -- "$1" "$tmp/out" || fail "the output does not have \"$1\""; }

mkdir "$tmp/bin"
cat >"$tmp/bin/apt-get" <<EOF
#!/bin/sh
# apt-get stub: records its arguments, prints a lot, fails for a package named *fail*.
echo "\$*" >>"$tmp/apt-calls"
for i in \$(seq 50); do echo "apt progress line \$i"; done
case "\$*" in *install*fail*) exit 100 ;; esac
exit 0
EOF
chmod +x "$tmp/bin/apt-get"
export PATH="$tmp/bin:$PATH" PIPEFLOW_INSTALL_LOG="$tmp/install.log"

# 1. Everything installed: silent, exit 0, no apt-get.
run PIPEFLOW_APT_LOCK_TIMEOUT=300 bash
[ "$status" -eq 0 ] || fail "exit status $status with nothing missing"
[ ! -s "$tmp/out" ] || fail "printed something with nothing missing"
[ ! -e "$tmp/apt-calls" ] || fail "ran apt-get with nothing missing"
echo "ok: nothing missing: silent, exit 0, no apt-get (${took}s)"

if [ "$(id -u)" -ne 0 ] || [ ! -e "$lock" ]; then
  echo "SKIP: the other cases hold $lock, which needs root and the file"
  exit 77
fi

# 2. The frontend lock held throughout: waits, then fails naming the lock and
#    its holder, without running apt-get.
hold
run PIPEFLOW_APT_LOCK_TIMEOUT=2 "$missing_pkg"
[ "$status" -ne 0 ] || fail "exit status 0 while $lock was held"
[ "$took" -le 10 ] || fail "took ${took}s to give up with a 2 s timeout"
has "waiting up to 2s for $lock, held by process $holder (flock -o $lock sleep 60)"
[ "$(grep -c waiting "$tmp/out")" -eq 1 ] || fail "the waiting line is not printed exactly once"
has "error: $lock is still held after 2s, by process $holder"
has "PIPEFLOW_APT_LOCK_TIMEOUT"
[ ! -e "$tmp/apt-calls" ] || fail "ran apt-get while $lock was held: $(cat "$tmp/apt-calls")"
release
flock -n "$lock" true || fail "$lock still held after the test released it"
echo "ok: lock held: waited, failed after ${took}s naming $lock and its holder, no apt-get"

# 3. The lock released while waiting: one line naming the package and the log,
#    apt's output in the log only, apt-get install told how long dpkg's locks may be waited for.
hold
(sleep 2 && release) &
run PIPEFLOW_APT_LOCK_TIMEOUT=30 "$missing_pkg"
wait $!
release
[ "$status" -eq 0 ] || fail "exit status $status after the lock was released"
has "waiting up to 30s for $lock"
has "installing missing Debian packages: $missing_pkg (apt's output: $tmp/install.log)"
[ "$(wc -l <"$tmp/out")" -eq 2 ] || fail "printed more than the waiting line and the installing line"
grep -q "apt progress line 50" "$tmp/install.log" || fail "apt's output is not in the log"
grep -q "^update" "$tmp/apt-calls" || fail "no apt-get update: $(cat "$tmp/apt-calls")"
grep -q "install .*-o DPkg::Lock::Timeout=[0-9]* $missing_pkg" "$tmp/apt-calls" ||
  fail "apt-get install without DPkg::Lock::Timeout: $(cat "$tmp/apt-calls")"
echo "ok: lock released after 2s: installed after ${took}s, one line, apt's output in the log"

# 4. apt-get fails: the log's last 30 lines and the exit status.
rm -f "$tmp/apt-calls"
run PIPEFLOW_APT_LOCK_TIMEOUT=30 pipeflow-fail
[ "$status" -eq 100 ] || fail "exit status $status, not apt-get's 100"
has "failed (apt-get exit status 100)"
has "apt progress line 50"
has "apt progress line 21"
! grep -q "apt progress line 20$" "$tmp/out" || fail "printed more than the log's last 30 lines"
echo "ok: apt-get failing: its exit status and the log's last 30 lines"
