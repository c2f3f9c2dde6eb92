"""Create a blob container on Azurite: `python3 azurite-container.py ENDPOINT CONTAINER`.

ENDPOINT is the account's URL (`http://127.0.0.1:PORT/devstoreaccount1`). The request is
signed with Azurite's well-known development account key (Shared Key authorization), so
no Azure SDK is needed. Exits non-zero unless the container was created or exists.
"""

import base64
import email.utils
import hashlib
import hmac
import sys
import urllib.error
import urllib.parse
import urllib.request

ACCOUNT = "devstoreaccount1"
KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
    "K1SZFPTOtr/KBHBeksoGMGw=="
)
VERSION = "2021-08-06"


def main() -> int:
    endpoint, container = sys.argv[1].rstrip("/"), sys.argv[2]
    url = f"{endpoint}/{container}?restype=container"
    date = email.utils.formatdate(usegmt=True)
    # VERB, then eleven standard headers (Content-Encoding, -Language, -Length (empty
    # for 0), -MD5, -Type, Date, If-Modified-Since, If-Match, If-None-Match,
    # If-Unmodified-Since, Range), then the x-ms-* headers and the canonical resource.
    content_type = "application/octet-stream"
    to_sign = (
        "PUT\n" + "\n" * 4 + content_type + "\n" + "\n" * 6
        + f"x-ms-date:{date}\nx-ms-version:{VERSION}\n"
        + f"/{ACCOUNT}{urllib.parse.urlparse(url).path}\nrestype:container"
    )
    sig = base64.b64encode(
        hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()
    ).decode()
    req = urllib.request.Request(url, method="PUT", data=b"")
    req.add_header("Content-Type", content_type)
    req.add_header("x-ms-date", date)
    req.add_header("x-ms-version", VERSION)
    req.add_header("Authorization", f"SharedKey {ACCOUNT}:{sig}")
    try:
        urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as e:
        if e.code != 409:  # 409: the container exists already
            print(e.code, e.read().decode(errors="replace"), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
