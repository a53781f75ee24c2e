#!/usr/bin/env bash
# Installs those of the given Debian packages that are missing (checked with
# dpkg -s; silent when none is). Prints one line naming them and the log that
# gets apt's output (build/install-deps.log, or $PIPEFLOW_INSTALL_LOG); on
# failure, the log's last lines and apt's exit status. When another apt or
# dpkg holds their locks it waits, up to $PIPEFLOW_APT_LOCK_TIMEOUT seconds
# (default 300), then fails naming the lock and the process holding it.
set -euo pipefail

missing=()
for pkg in "$@"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "error: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
timeout=${PIPEFLOW_APT_LOCK_TIMEOUT:-300}
[[ $timeout =~ ^[0-9]+$ ]] || { echo "error: PIPEFLOW_APT_LOCK_TIMEOUT='$timeout': want whole seconds" >&2; exit 1; }
log=${PIPEFLOW_INSTALL_LOG:-$(cd "$(dirname "$0")/.." && pwd)/build/install-deps.log}

# held: "LOCK PID (COMMAND)" for the first of apt's and dpkg's locks that a
# process holds, found in /proc/locks by the file's device and inode. apt and
# dpkg take fcntl locks, which flock(1) neither sees nor blocks; /proc/locks
# lists fcntl and flock locks alike. apt-get's DPkg::Lock::Timeout covers only
# dpkg's two locks, not `apt-get update`'s lists lock nor the archives' lock.
held() {
  local lock dev ino id pid cmd
  for lock in /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock; do
    read -r dev ino < <(stat -Lc '%d %i' "$lock" 2>/dev/null) || continue
    # /proc/locks names a file "MAJOR:MINOR:INODE" (hexadecimal major and minor).
    id=$(printf '%02x:%02x:%d' $((((dev >> 8) & 0xfff) | ((dev >> 32) & 0xfffff000))) \
      $(((dev & 0xff) | ((dev >> 12) & 0xffffff00))) "$ino")
    pid=$(awk -v id="$id" '$2 != "->" && $6 == id { print $5; exit }' /proc/locks 2>/dev/null) || true
    [ -n "$pid" ] || continue
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || true
    cmd=${cmd% }
    echo "$lock $pid (${cmd:-command unknown})"
    return 0
  done
  return 1
}

deadline=$((SECONDS + timeout))
waiting=""
while holder=$(held); do
  if [ $SECONDS -ge $deadline ]; then
    echo "error: ${holder%% *} is still held after ${timeout}s, by process ${holder#* }." >&2
    echo "Another apt or dpkg is running (unattended-upgrades, another install): let it finish and run this again," >&2
    echo "or wait longer with PIPEFLOW_APT_LOCK_TIMEOUT=SECONDS." >&2
    exit 1
  fi
  [ -n "$waiting" ] || echo "waiting up to ${timeout}s for ${holder%% *}, held by process ${holder#* }"
  waiting=1
  sleep 1
done

echo "installing missing Debian packages: ${missing[*]} (apt's output: $log)"
mkdir -p "$(dirname "$log")"
left=$((deadline > SECONDS ? deadline - SECONDS : 0))
status=0
{
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update &&
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      -o DPkg::Lock::Timeout="$left" "${missing[@]}"
} >"$log" 2>&1 </dev/null || status=$?
if [ $status -ne 0 ]; then
  echo "error: installing ${missing[*]} failed (apt-get exit status $status); the last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit $status
fi
