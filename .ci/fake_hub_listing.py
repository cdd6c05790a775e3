"""A stand-in for the Hugging Face hub on loopback, for .ci/walkthrough.sh: the search box of
the window's model library asks it for its listing, so the walkthrough can show search results
without the network, and its files come slowly (zeros, 1 MB/s), so that the library's downloads
can be seen under way. Usage: fake_hub_listing.py PORT_FILE (it writes the port it got there).
"""
import http.server
import json
import sys
import time
import urllib.parse

MODELS = [
    {"id": "Qwen/Qwen3-1.7B", "downloads": 1203456, "tags": ["safetensors", "text-generation"]},
    {"id": "Qwen/Qwen3-1.7B-GGUF", "downloads": 182345, "tags": ["gguf"]},
    {"id": "unsloth/Qwen3-1.7B-GGUF", "downloads": 95021, "tags": ["gguf"]},
]
FILES = {
    "Qwen/Qwen3-1.7B-GGUF": [
        ("README.md", 4000),
        ("Qwen3-1.7B-Q4_K_M.gguf", 1107409472),
        ("Qwen3-1.7B-Q8_0.gguf", 1834426016),
        ("Qwen3-1.7B-BF16.gguf", 3447000000),
    ]
}


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def file_size(path):
    """The listed size of `/{repo}/resolve/{revision}/{file}`, or None."""
    for repo, files in FILES.items():
        prefix = f"/{repo}/resolve/"
        if path.startswith(prefix):
            name = path[len(prefix):].split("/", 1)[-1]
            return next((size for n, size in files if n == name), None)
    return None


class Listing(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def file_head(self, size):
        self.send_response(200)
        self.send_header("x-repo-commit", COMMIT)
        self.send_header("etag", '"' + "ab" * 32 + '"')
        self.send_header("Content-Length", str(size))
        self.send_header("Connection", "close")
        self.end_headers()

    def do_HEAD(self):
        size = file_size(urllib.parse.urlparse(self.path).path)
        if size is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.file_head(size)

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        size = file_size(url.path)
        if size is not None:
            self.file_head(size)
            try:
                for _ in range(size // 100_000):
                    self.wfile.write(bytes(100_000))
                    time.sleep(0.1)
            except OSError:
                pass
            return
        if url.path == "/api/models":
            words = urllib.parse.parse_qs(url.query).get("search", [""])[0].lower().split()
            body = [m for m in MODELS if all(w in m["id"].lower() for w in words)]
        elif url.path.startswith("/api/models/"):
            repo = url.path[len("/api/models/"):].split("/revision/")[0]
            files = FILES.get(repo, [])
            body = {"id": repo, "siblings": [{"rfilename": n, "size": s} for n, s in files]}
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listing)
with open(sys.argv[1], "w") as port_file:
    port_file.write(str(server.server_port))
server.serve_forever()
