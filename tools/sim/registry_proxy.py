#!/usr/bin/python3
"""An HTTPS reverse proxy in front of a real registry (docker-registry) that adds what a test
needs and the registry cannot do by itself: bearer-token auth with its own token endpoint,
5xx answers, a registry that hangs, blob transfers cut in the middle (to exercise Range
resumes), a registry that ignores Range (resumes get the whole blob again), a blob transfer
that stalls after some bytes (a pull stopped in the middle). Everything else is passed through
unchanged, Range requests included.

  registry_proxy.py --upstream 127.0.0.1:5000 --cacert ca.pem --cert c.pem --key k.pem \
      [--token USER:PASS] [--fail-first N] [--hang] [--cut-blob-after BYTES] [--ignore-range]
      [--stall-blob-after BYTES]

Prints "listening on PORT" once it accepts connections (port 0 picks a free one).
"""

import argparse
import base64
import http.client
import http.server
import socketserver
import ssl
import sys
import threading
import time

TOKEN = "gkm-test-token"


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = {"requests": 0, "cut": set()}
    lock = threading.Lock()

    def log_message(self, fmt, *args):  # quiet
        pass

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        a = self.server.args
        if self.path.startswith("/token"):
            want = "Basic " + base64.b64encode(a.token.encode()).decode()
            if self.headers.get("Authorization") != want:
                return self.reply(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
            return self.reply(200, ('{"token":"%s","expires_in":300}' % TOKEN).encode(),
                              [("Content-Type", "application/json")])
        with self.lock:
            self.state["requests"] += 1
            n = self.state["requests"]
        if a.hang:
            time.sleep(3600)
            return
        if n <= a.fail_first:
            return self.reply(503, b'{"errors":[{"code":"UNAVAILABLE","message":"injected"}]}',
                              [("Content-Type", "application/json")])
        if a.token and self.path.startswith("/v2/") and self.path != "/v2/":
            if self.headers.get("Authorization") != "Bearer " + TOKEN:
                repo = self.path[4:].split("/manifests/")[0].split("/blobs/")[0]
                host = "127.0.0.1:%d" % self.server.server_address[1]
                challenge = 'Bearer realm="https://%s/token",service="gkm-test",scope="repository:%s:pull"' % (host, repo)
                return self.reply(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                                  [("WWW-Authenticate", challenge), ("Content-Type", "application/json")])
        up = http.client.HTTPSConnection(a.upstream, context=self.server.upstream_ctx, timeout=60)
        dropped = ("authorization", "host", "connection") + (("range",) if a.ignore_range else ())
        headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
        up.request("GET", self.path, headers=headers)
        r = up.getresponse()
        cut = None
        if a.cut_blob_after and "/blobs/" in self.path and r.status == 200:
            with self.lock:
                if self.path not in self.state["cut"]:
                    self.state["cut"].add(self.path)
                    cut = a.cut_blob_after
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("connection", "transfer-encoding"):
                self.send_header(k, v)
        self.end_headers()
        sent = 0
        while True:
            chunk = r.read(65536)
            if not chunk:
                break
            if a.stall_blob_after and "/blobs/" in self.path and r.status == 200 and \
                    sent + len(chunk) >= a.stall_blob_after:
                self.wfile.write(chunk[: a.stall_blob_after - sent])
                self.wfile.flush()
                time.sleep(3600)
                return
            if cut is not None and sent + len(chunk) >= cut:
                self.wfile.write(chunk[: cut - sent])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(chunk)
            sent += len(chunk)
        up.close()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True)
    p.add_argument("--cacert", required=True, help="CA of the upstream registry")
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", default="", help="USER:PASS the token endpoint wants; enables bearer auth")
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--cut-blob-after", type=int, default=0)
    p.add_argument("--ignore-range", action="store_true")
    p.add_argument("--stall-blob-after", type=int, default=0)
    args = p.parse_args()
    server = Server(("127.0.0.1", args.port), Proxy)
    server.args = args
    server.upstream_ctx = ssl.create_default_context(cafile=args.cacert)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print("listening on %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
