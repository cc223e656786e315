// pai portal: progressive enhancement only; every page works without it.
"use strict";

function selectAll() {
  const all = document.getElementById("select-all");
  if (!all) return;
  all.addEventListener("change", () => {
    for (const box of document.querySelectorAll('#jobs input[name="job"]')) box.checked = all.checked;
  });
}

function loadFile() {
  const input = document.getElementById("file");
  const text = document.getElementById("config");
  if (!input || !text) return;
  input.addEventListener("change", () => {
    const file = input.files && input.files[0];
    if (!file) return;
    file.text().then((content) => { text.value = content; });
  });
}

// The log viewer: a task's log through the API's server-sent events. The
// browser reconnects by itself and resumes after the last line (Last-Event-ID);
// the "end" event says the task ended and the whole log was sent.
let source = null;
let following = "";

function follow(button) {
  const pre = document.getElementById("log-text");
  const note = document.getElementById("log-source");
  if (!pre || !note) return;
  if (source) source.close();
  following = button.dataset.src;
  pre.textContent = "";
  const label = button.dataset.label;
  note.textContent = "Following the log of " + label + "…";
  const url = following + (following.includes("?") ? "&" : "?") + "follow=true&tail=1000";
  source = new EventSource(url);
  source.onmessage = (event) => {
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(event.data + "\n");
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  };
  source.addEventListener("end", () => {
    source.close();
    note.textContent = "The log of " + label + " is complete (the task ended).";
  });
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) note.textContent = "The log of " + label + " is unavailable.";
  };
}

function followFirst() {
  if (following) return;
  const first = document.querySelector("button.show-log");
  if (first) follow(first);
}

// A part of the page that the server renders again while it is not final
// (data-final): every interval(element) ms the element `id` is read from
// url(element), and the fresh copy's data-final and what apply(element,
// fresh) takes from it replace the old; a failed read just waits for the next.
function keepFresh(id, url, interval, apply) {
  const element = document.getElementById(id);
  if (!element || element.dataset.final === "true") return;
  setTimeout(() => {
    fetch(url(element), {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then((response) => response.ok ? response.text() : Promise.reject(response.status))
      .then((html) => {
        const fresh = new DOMParser().parseFromString(html, "text/html").getElementById(id);
        if (fresh) {
          element.dataset.final = fresh.dataset.final;
          apply(element, fresh);
        }
      })
      .catch(() => {})
      .finally(() => keepFresh(id, url, interval, apply));
  }, interval(element));
}

// While a job is not final, its status, tasks and attempts are read again
// every few seconds from this same page (no second way to render them).
const REFRESH_MS = 2000;

function refreshJob() {
  keepFresh("job", () => window.location.href, () => REFRESH_MS, (job, fresh) => {
    job.innerHTML = fresh.innerHTML;
    followFirst();
  });
}

// While the job runs, its charts are drawn again from the server (the same
// fragment the page holds) every data-refresh-ms; they stop once it ended.
function refreshUsage() {
  keepFresh("usage", (usage) => usage.dataset.src,
    (usage) => Number(usage.dataset.refreshMs) || 10000, (usage, fresh) => {
      usage.replaceChildren(...fresh.childNodes);
      usage.dataset.redraws = String(Number(usage.dataset.redraws || 0) + 1);
    });
}

// Storage uploads: each file in parts of data-part-bytes, one request per
// part (the first makes the file anew, each next one is appended where the
// file ends), so a large file never rides one request; a failed part is
// sent again a few times before the upload gives up.
const PART_TRIES = 3;

async function sendPart(drop, path, file, offset) {
  const end = Math.min(offset + Number(drop.dataset.partBytes), file.size);
  const url = drop.dataset.upload + "?path=" + encodeURIComponent(path) + "&offset=" + offset;
  let last = "";
  for (let attempt = 0; attempt < PART_TRIES; attempt++) {
    try {
      const answer = await fetch(url, {method: "POST", credentials: "same-origin",
        headers: {"X-CSRF-Token": drop.dataset.csrf, "Content-Type": "application/octet-stream"},
        body: file.slice(offset, end)});
      const body = await answer.json().catch(() => ({}));
      if (answer.ok) return body.length;
      last = body.message || ("HTTP " + answer.status);
      if (answer.status < 500) break;
    } catch (error) {
      last = String(error);
    }
  }
  throw new Error(last);
}

async function upload(drop, file) {
  const item = document.createElement("li");
  const bar = document.createElement("progress");
  bar.max = file.size || 1;
  bar.value = 0;
  item.append(file.name + " ", bar);
  document.getElementById("uploads").append(item);
  const path = drop.dataset.path.replace(/\/$/, "") + "/" + file.name;
  let offset = 0;
  try {
    do {
      offset = await sendPart(drop, path, file, offset);
      bar.value = offset;
    } while (offset < file.size);
    item.append(" done");
    item.className = "done";
  } catch (error) {
    item.append(" failed: " + error.message);
    item.className = "error";
  }
}

async function uploadAll(drop, files) {
  for (const file of files) await upload(drop, file);
  if (!document.querySelector("#uploads li.error")) window.location.reload();
}

function uploads() {
  const drop = document.getElementById("drop");
  if (!drop) return;
  const input = document.getElementById("upload-files");
  input.addEventListener("change", () => uploadAll(drop, Array.from(input.files)));
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    uploadAll(drop, Array.from(event.dataTransfer.files));
  });
}

document.addEventListener("click", (event) => {
  const button = event.target.closest && event.target.closest("button.show-log");
  if (button) follow(button);
});

document.addEventListener("DOMContentLoaded", () => {
  selectAll();
  loadFile();
  followFirst();
  refreshJob();
  refreshUsage();
  uploads();
});
