"""A stand-in for the Hugging Face hub's model listing on loopback, for .ci/walkthrough.sh: the
search box of the window's model library asks it, so the walkthrough can show search results
without the network. Usage: fake_hub_listing.py PORT_FILE (it writes the port it got there).
"""
import http.server
import json
import sys
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


class Listing(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/api/models":
            words = urllib.parse.parse_qs(url.query).get("search", [""])[0].lower().split()
            body = [m for m in MODELS if all(w in m["id"].lower() for w in words)]
        elif url.path.startswith("/api/models/"):
            repo = url.path[len("/api/models/"):].split("/revision/")[0]
            files = FILES.get(repo, [])
            body = {"id": repo, "siblings": [{"rfilename": n, "size": s} for n, s in files]}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Listing)
with open(sys.argv[1], "w") as port_file:
    port_file.write(str(server.server_port))
server.serve_forever()
