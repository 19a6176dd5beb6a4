// The appliance's web viewer: a grid of every stream, live; one stream large with its
// predictions, latency and profiling. Only the /v1 API, with the user's token.
// No build step, no dependency: ES modules served as they are.

import { $, apiJson, auth, say } from "./api.js";
import { Grid } from "./grid.js";
import { profile, resetProfile } from "./profile.js";
import { StreamView } from "./stream.js";
import { refreshWatch } from "./watch.js";

const STREAMS_EVERY_MS = 3000;

let view = null; // the stream open large: a StreamView
const grid = new Grid($("grid"), (id) => navigate(`/streams/${encodeURIComponent(id)}`));

// -- the token ---------------------------------------------------------------------------
// Asked for only when the appliance answers 401: a loopback appliance without a token never
// does, and then neither the form nor the "Token…" button shows. Once asked (or with a token
// held from before), the button stays, to change the token.
auth.onUnauthorized = (reason) => {
  $("change-token").hidden = false;
  say("token-reason", reason);
  say("status", "");
  $("token-form").hidden = false;
  if (document.activeElement !== $("token")) $("token").focus();
};

// What the token may do: the Profile panel for an operator, not for a viewer (the API
// would refuse it anyway: this only spares a button that cannot work).
auth.onRole = () => {
  $("profile-panel").hidden = !auth.can("operator");
  if (view) refreshWatch(view); // its evidence links, now that the role is known
};

async function refreshRole() {
  try {
    await auth.refreshRole();
  } catch (err) {
    if (err.status !== 401) say("status", `Who am I: ${err.message}; trying again.`);
  }
}

function useToken(event) {
  event.preventDefault();
  auth.set($("token").value.trim());
  $("token").value = "";
  $("token-form").hidden = true;
  say("status", "");
  refreshRole();
  refreshStreams();
  route(); // players that met the 401 start again
}

// -- the streams, read every few seconds ---------------------------------------------------
async function refreshStreams() {
  let streams;
  try {
    streams = (await apiJson("GET", "/v1/streams")).streams;
  } catch (err) {
    if (err.status !== 401) say("status", `Streams: ${err.message}; trying again.`);
    return;
  }
  say("status", ""); // whatever failed before is over
  $("token-form").hidden = true;
  if (auth.role === null) refreshRole();
  grid.update(streams);
  const open = view && streams.find((s) => s.id === view.id);
  if (open) view.update(open);
  else if (view) say("stream-error", `No stream named ${view.id} runs now.`);
}

// -- which view: the grid at /, one stream at /streams/{id} ----------------------------------
// and, at /streams/{id}/frames/{seq} (where a Grafana exemplar's link lands), that stream
// with the frame's trace open: opened again after a new token until it shows.
const PAGE_PATH = /^\/streams\/([^/]+)(?:\/frames\/([^/]+))?$/;

function route() {
  const match = location.pathname.match(PAGE_PATH);
  const id = match ? decodeURIComponent(match[1]) : null;
  if (view && view.id !== id) closeStream();
  if (id && !view) openStream(id);
  else if (view && id) view.play(); // the same stream, e.g. after a new token
  grid.show(!id);
  if (!id) document.title = "appliance viewer";
  if (view && match[2] !== undefined) openFrame(match[2]);
}

function openFrame(text) {
  const seq = /^\d+$/.test(text) ? Number(text) : NaN;
  if (!Number.isSafeInteger(seq)) say("frame-trace-status", `No frame ${text}: not a number.`);
  else if (view.slowest.shown !== seq) view.slowest.openFrame(seq);
}

function openStream(id) {
  resetProfile();
  view = new StreamView(id);
  $("viewer").hidden = false;
  $("stream-state").textContent = "";
  say("stream-error", "");
  view.open();
}

function closeStream() {
  view?.close();
  view = null;
  resetProfile();
  $("viewer").hidden = true;
}

function navigate(path) {
  history.pushState(null, "", path);
  route();
}

// -- the video's controls ---------------------------------------------------------------------
function fullscreen() {
  if (document.fullscreenElement) document.exitFullscreen();
  else $("media").requestFullscreen().catch((err) => say("video-status", `Fullscreen: ${err.message}`));
}

async function pictureInPicture() {
  try {
    if (document.pictureInPictureElement) await document.exitPictureInPicture();
    else await $("video").requestPictureInPicture();
  } catch (err) {
    say("video-status", `Picture-in-picture: ${err.message}`);
  }
}

$("token-form").addEventListener("submit", useToken);
$("change-token").addEventListener("click", () => auth.onUnauthorized("Enter the appliance's API token."));
$("back").addEventListener("click", () => navigate("/"));
$("video-mode").addEventListener("change", () => view?.play());
$("video-size").addEventListener("change", () => view?.play());
$("fullscreen").addEventListener("click", fullscreen);
$("pip").addEventListener("click", pictureInPicture);
$("pip").hidden = !document.pictureInPictureEnabled;
$("profile-form").addEventListener("submit", (event) => profile(event, view.id));
$("shadow-toggle").addEventListener("click", () => view?.shadow.toggle());
window.addEventListener("popstate", route);
window.addEventListener("pagehide", () => { view?.close(); grid.stopAll(); });
$("change-token").hidden = !auth.token;
refreshStreams();
setInterval(refreshStreams, STREAMS_EVERY_MS);
route();
