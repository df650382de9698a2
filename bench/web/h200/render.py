"""Renders the web view's page from a capture made on a GPU machine (device.sh), here, in a
headless Chromium: the page's own files (orchestrator/src/web/assets) are served with the
captured answers at the routes the daemon serves them on, and the run's page is screenshotted
(whole page, then with a stage opened).

    python3 bench/web/h200/render.py CAPTURE_DIR OUT_DIR
"""
import base64
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

cap, out = sys.argv[1], sys.argv[2]
assets = os.path.join(os.path.dirname(__file__), "..", "..", "..", "orchestrator", "src", "web", "assets")
rid = open(os.path.join(cap, "run_id.txt")).read().strip()
routes = {
    "/": ("text/html", os.path.join(assets, "index.html")),
    "/app.js": ("text/javascript", os.path.join(assets, "app.js")),
    "/app.css": ("text/css", os.path.join(assets, "app.css")),
    "/api/runs": ("application/json", os.path.join(cap, "runs.json")),
    f"/api/runs/{rid}": ("application/json", os.path.join(cap, "run.json")),
    f"/api/runs/{rid}/memory": ("application/json", os.path.join(cap, "memory.json")),
    f"/api/runs/{rid}/events": ("text/event-stream", os.path.join(cap, "events.sse")),
}
for s in ("warmup", "train", "eval"):
    for stream in ("stderr", "stdout"):
        routes[f"/api/runs/{rid}/stages/{s}/log?stream={stream}"] = ("text/plain", os.path.join(cap, f"log-{s}-{stream}.txt"))


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        found = routes.get(self.path)
        if not found:
            self.send_error(404)
            return
        body = open(found[1], "rb").read()
        self.send_response(200)
        self.send_header("Content-Type", found[0])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


port = free_port()
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
dport = free_port()
driver = subprocess.Popen(["chromedriver", f"--port={dport}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wd(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(f"http://127.0.0.1:{dport}{path}", data=data, method=method,
                               headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r, timeout=120).read())["value"]


try:
    for _ in range(100):
        try:
            wd("GET", "/status")
            break
        except OSError:
            time.sleep(0.1)
    session = wd("POST", "/session", {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
        "binary": "/usr/bin/chromium",
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,1750"]}}}})["sessionId"]
    s = f"/session/{session}"
    wd("POST", s + "/url", {"url": f"http://127.0.0.1:{port}/#/run/{rid}"})

    def until(script, limit=20):
        for _ in range(limit * 10):
            if wd("POST", s + "/execute/sync", {"script": script, "args": []}):
                return
            time.sleep(0.1)
        raise SystemExit("the page did not show: " + script)

    until("return document.querySelectorAll('#verdicts tbody tr').length >= 3 && !!document.querySelector('svg[data-gpu] polyline.used')")
    wd("POST", s + "/execute/sync", {"script": "document.querySelector('#stages tr[data-stage=\"train\"] a.stage').click(); return true", "args": []})
    until("return (document.querySelector('#log') || {}).textContent?.includes('step 8/8')")
    time.sleep(0.5)
    os.makedirs(out, exist_ok=True)
    png = base64.b64decode(wd("GET", s + "/screenshot"))
    open(os.path.join(out, "web-h200-run.png"), "wb").write(png)
    wd("DELETE", s)
    print(os.path.join(out, "web-h200-run.png"))
finally:
    driver.terminate()
    server.shutdown()
