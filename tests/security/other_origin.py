"""A web page of another origin on this machine, as any page the operator visits could
be: a loopback HTTP server on a port of its own (so another origin, and the same site as
an appliance on 127.0.0.1), serving one page whose script tries to change an appliance it
did not come from: a fetch that needs no preflight (`no-cors`, `text/plain`), a form
POST into a frame (`text/plain`, `multipart/form-data`) and a JSON fetch (preflighted).

The page learns little of what the appliance answered (a `no-cors` answer is opaque, a
frame of another origin unreadable); the tests read the answers from the browser's own
network events and the outcome from the appliance's API."""

from __future__ import annotations

import http.server
import threading

PAGE = b"""<!doctype html>
<meta charset="utf-8">
<title>another origin</title>
<script>
// A fetch a browser sends without asking the appliance first: its answer is opaque.
window.noCors = async (url, body) => {
  await fetch(url, {method: "POST", mode: "no-cors", body,
                    headers: {"Content-Type": "text/plain"}});
  return "sent";
};
// A JSON fetch: the browser asks the appliance first (a CORS preflight), and sends the
// request only if the appliance names this origin in its answer.
window.corsJson = async (url, body) => {
  try {
    const resp = await fetch(url, {method: "POST", body,
                                   headers: {"Content-Type": "application/json"}});
    return {status: resp.status, body: await resp.text()};  // readable: CORS allowed it
  } catch (exc) {
    return {status: 0, body: String(exc)};
  }
};
// A form POST into a new frame, one field: what an HTML form can send anywhere.
window.formPost = (url, enctype, name, value) => {
  const frame = document.createElement("iframe");
  frame.name = `frame-${document.querySelectorAll("iframe").length}`;
  document.body.append(frame);
  const form = document.createElement("form");
  Object.assign(form, {method: "POST", action: url, enctype, target: frame.name});
  const field = document.createElement("input");
  Object.assign(field, {type: "hidden", name, value});
  form.append(field);
  document.body.append(form);
  form.submit();
  return "submitted";
};
</script>
<p>Nothing to see here.</p>
"""


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: pytest shows the failures, not every page load."""


class OtherOrigin:
    """The page's server on 127.0.0.1 and a port of its own, served by a named thread
    until `close`."""

    def __init__(self) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"other-origin-{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
