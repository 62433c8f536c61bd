# Sourced by the setup scripts: apt_install PACKAGE... installs Debian packages (sudo when not root), retrying once
# after `apt-get update` (a fresh machine's package lists may be missing or stale).
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
apt_install() {
    echo "setup: installing $*"
    $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
        || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
}
