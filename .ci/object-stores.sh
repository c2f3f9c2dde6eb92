# Source this file (after .ci/s3-server.sh), then `start_azurite`: installs Azurite from
# npm under target/azurite, starts its blob service on a free loopback port, creates a
# container, exports the variables the `azure` feature reads plus TH_AZURE_CONTAINER,
# and stops it when the calling shell exits (`stop_object_stores`, chained into the EXIT
# trap). When it returns non-zero it has set OBJECT_STORE_SKIP_REASON: the tier is
# skipped and says why.

AZURITE_DIR="${AZURITE_DIR:-target/azurite}"
AZURITE_PID=""
OBJECT_STORE_SKIP_REASON=""

stop_object_stores() {
    if [ -n "$AZURITE_PID" ]; then
        kill "$AZURITE_PID" 2>/dev/null || true
        wait "$AZURITE_PID" 2>/dev/null || true
        AZURITE_PID=""
    fi
}

# Wait (bounded) until `http://127.0.0.1:$1/` answers HTTP, while pid $2 lives.
wait_http() {
    local i
    for i in $(seq 1 120); do
        if curl -s -o /dev/null "http://127.0.0.1:$1/"; then return 0; fi
        if ! kill -0 "$2" 2>/dev/null; then return 1; fi
        sleep 0.5
    done
    return 1
}

start_azurite() {
    local port container="th-ci"
    if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
        OBJECT_STORE_SKIP_REASON="node and npm are not installed"
        return 1
    fi
    mkdir -p "$AZURITE_DIR"
    if ! [ -x "$AZURITE_DIR/node_modules/.bin/azurite-blob" ]; then
        if ! (cd "$AZURITE_DIR" && npm install --no-audit --no-fund --silent azurite@3.35.0 \
                >install.log 2>&1); then
            OBJECT_STORE_SKIP_REASON="npm install azurite failed (see $AZURITE_DIR/install.log)"
            return 1
        fi
    fi
    port="$(free_port)"
    # The trap is in place before the emulator starts, so no exit path leaves it running.
    trap 'stop_object_stores; stop_s3_server' EXIT
    "$AZURITE_DIR/node_modules/.bin/azurite-blob" --inMemoryPersistence \
        --blobHost 127.0.0.1 --blobPort "$port" --skipApiVersionCheck --silent \
        >target/azurite.log 2>&1 &
    AZURITE_PID=$!
    if ! wait_http "$port" "$AZURITE_PID"; then
        cat target/azurite.log >&2
        OBJECT_STORE_SKIP_REASON="Azurite did not start"
        return 1
    fi
    # Explicit account, key and endpoint rather than AZURE_STORAGE_USE_EMULATOR, so that
    # a test can point a client at a proxy in front of the emulator.
    export AZURE_STORAGE_ACCOUNT_NAME=devstoreaccount1
    export AZURE_STORAGE_ACCOUNT_KEY='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='
    export AZURE_STORAGE_ENDPOINT="http://127.0.0.1:$port/devstoreaccount1"
    export AZURE_ALLOW_HTTP=true
    python3 .ci/azurite-container.py "$AZURE_STORAGE_ENDPOINT" "$container"
    export TH_AZURE_CONTAINER="$container"
    echo "Azurite on $AZURE_STORAGE_ENDPOINT (pid $AZURITE_PID), container $container"
}
