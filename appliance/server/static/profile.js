// Profiling windows from the page: start one for the open stream, follow it, offer its
// trace. Switching streams forgets the last one's result.

import { $, ApiError, api, apiJson, say } from "./api.js";

let generation = 0; // bumped on every switch: a window's late result is not shown elsewhere

export function resetProfile() {
  generation += 1;
  $("profile-result").hidden = true;
  $("profile-progress").hidden = true;
  $("profile-start").disabled = false;
  say("profile-status", "");
  const link = $("profile-link");
  if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
  link.removeAttribute("href");
}

export async function profile(event, streamId) {
  event.preventDefault();
  const mine = generation;
  const body = { duration_s: Number($("profile-duration").value), streams: [streamId],
    ort_operators: $("profile-ort").checked };
  $("profile-start").disabled = true;
  $("profile-result").hidden = true;
  try {
    await followWindow(await apiJson("POST", "/v1/profiling", body), mine);
  } catch (err) {
    if (err.status !== 401 && mine === generation) say("profile-status", `Profiling: ${err.message}`);
  } finally {
    if (mine === generation) {
      $("profile-start").disabled = false;
      $("profile-progress").hidden = true;
    }
  }
}

async function followWindow(win, mine) {
  const started = performance.now();
  const bar = $("profile-progress");
  bar.hidden = false;
  let status = win;
  say("profile-status", `Profiling window ${win.id} runs for ${win.duration_s} s…`);
  while (status.state === "running") {
    bar.value = Math.min(1, (performance.now() - started) / 1000 / win.duration_s);
    await new Promise((r) => setTimeout(r, 250));
    status = await apiJson("GET", `/v1/profiling/${encodeURIComponent(win.id)}`);
  }
  if (status.state === "failed") throw new ApiError(0, status.error ?? "failed");
  const blob = await (await api("GET", status.trace)).blob();
  if (mine !== generation) return; // another stream is open now
  const link = $("profile-link");
  if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
  link.href = URL.createObjectURL(blob);
  link.download = `appliance-${win.id}.json`;
  $("profile-result").hidden = false;
  say("profile-status", `Window ${win.id} done: its trace is ready.`);
}
